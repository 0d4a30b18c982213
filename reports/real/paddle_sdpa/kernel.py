"""PaddlePaddle's `paddle.nn.functional.scaled_dot_product_attention` (CPU) in the torch SDPA convention.

Paddle takes query [batch_size, seq_len, num_heads, head_dim] and key/value with their own lengths
and head counts (`enable_gqa`, default True), `attn_mask` bool (True = take part) or additive,
`is_causal`, `scale` (None -> 1/sqrt(head_dim)) and `dropout_p` with `training`. The wrapper
transposes (B, H, L, D) to Paddle's layout and back through NumPy. torch's top-left `is_causal`
is passed as Paddle's `is_causal` only when Lq == Lk (the docstring does not state the alignment)
and as a bool mask otherwise. Forward only: gradients are Paddle's autograd, not torch's.
"""
from __future__ import annotations

import numpy as np
import paddle
import torch

from reports.real._bridge import to_numpy, to_torch, top_left_causal

paddle.set_device("cpu")
_PD = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_BACK = {paddle.float64: torch.float64, paddle.float32: torch.float32, paddle.float16: torch.float16,
         paddle.bfloat16: torch.bfloat16}


def _pd(t: torch.Tensor, dtype: str) -> paddle.Tensor:
    return paddle.to_tensor(to_numpy(t)).astype(dtype)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if query.dtype not in _PD:
        raise NotImplementedError(f"no Paddle dtype for {query.dtype}")
    dt = _PD[query.dtype]
    q, k, v = (_pd(t.transpose(1, 2), dt) for t in (query, key, value))
    lq, lk = query.shape[-2], key.shape[-2]
    mask = None
    if is_causal and lq != lk:
        mask, is_causal = paddle.to_tensor(top_left_causal(lq, lk)), False
    elif attn_mask is not None:
        mask = paddle.to_tensor(to_numpy(attn_mask)) if attn_mask.dtype == torch.bool else _pd(attn_mask, dt)
    out = paddle.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=bool(is_causal), training=dropout_p > 0,
        scale=scale, enable_gqa=True)
    back = _BACK[out.dtype]
    return to_torch(np.asarray(out.astype("float32" if dt == "bfloat16" else dt).numpy()), back).transpose(1, 2)
