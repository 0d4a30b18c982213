"""`mlx.core.fast.scaled_dot_product_attention` (MLX, CPU build on Linux) in the torch SDPA convention.

MLX takes q [B, N_q, T_q, D], k/v [B, N_kv, T_kv, D] (GQA by not pre-tiling K/V), a required
`scale`, and `mask` as None, "causal" (lower-right aligned) or a bool/additive array broadcast to
[B, N, T_q, T_kv]. torch's `is_causal` is top-left, so it is passed as MLX's "causal" only where
the two agree (T_q == T_kv) and as an explicit bool mask otherwise. Forward only: MLX's
gradients are MLX's (mx.vjp), not torch autograd, so the wrapper declares no backward.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import torch

from reports.real._bridge import to_numpy, to_torch, top_left_causal

_MX = {torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16}


def _mx(t: torch.Tensor, dtype) -> mx.array:
    return mx.array(to_numpy(t)).astype(dtype)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise NotImplementedError("mx.fast.scaled_dot_product_attention has no dropout")
    if query.dtype not in _MX:
        raise NotImplementedError(f"no MLX dtype for {query.dtype}")
    dt = _MX[query.dtype]
    q, k, v = (_mx(t, dt) for t in (query, key, value))
    lq, lk = query.shape[-2], key.shape[-2]
    mask = None
    if is_causal:
        mask = "causal" if lq == lk else mx.array(top_left_causal(lq, lk))
    elif attn_mask is not None:
        mask = mx.array(to_numpy(attn_mask)) if attn_mask.dtype == torch.bool else _mx(attn_mask, dt)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    mx.eval(out)
    out_dtype = {mx.float32: torch.float32, mx.float16: torch.float16, mx.bfloat16: torch.bfloat16}[out.dtype]
    return to_torch(np.array(out.astype(mx.float32)), out_dtype)


sdpa.mlx_version = mx.__version__
