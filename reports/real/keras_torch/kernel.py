"""`keras.ops.dot_product_attention` (Keras 3, torch backend) in the torch SDPA convention.

Keras takes query (B, T, N, H), key and value (B, S, K, H) (GQA when N is a multiple of K), a
bool `mask` (True = take part), an additive `bias`, `scale` (None -> 1/sqrt(H)) and `is_causal`,
whose alignment the docstring does not state: the wrapper passes `is_causal` only where top-left
and bottom-right agree (T == S) and an explicit bool `mask` otherwise. Torch tensors go in and
come out as they are (the torch backend's arrays), so gradients are torch autograd's.
"""
from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import torch  # noqa: E402

if keras.backend.backend() != "torch":
    raise ImportError(f"keras runs the {keras.backend.backend()!r} backend; set KERAS_BACKEND=torch")


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise NotImplementedError("keras.ops.dot_product_attention has no dropout")
    lq, lk = query.shape[-2], key.shape[-2]
    mask = bias = None
    if is_causal and lq != lk:
        mask, is_causal = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(), False
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = attn_mask
        else:
            bias = attn_mask
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = keras.ops.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=bool(is_causal))
    return out.transpose(1, 2)
