"""An honest NumPy kernel in the SDPA calling convention (`--backend=numpy --kernel=...`).

Self-contained (NumPy only, no attnconf import): tests copy this file into a folder outside the
checkout to play a kernel repository. It computes in float64 and returns the input dtype, so it
is correct to one rounding: bool mask True = attend, float mask added to the scaled logits,
top-left `is_causal`, repeat GQA grouping, rows with no visible key output 0, dropout keeps each
weight with probability 1-p and rescales it by 1/(1-p).
"""
from __future__ import annotations

import math

import numpy as np

_RNG = np.random.default_rng(0)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    out_dtype = query.dtype
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (query, key, value))
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible shapes {q.shape}, {k.shape}, {v.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"key and value lengths differ: {k.shape}, {v.shape}")
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if not enable_gqa or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"query heads {q.shape[-3]} vs key heads {k.shape[-3]}")
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    s = (q @ np.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    vis = np.ones((L, S), dtype=bool)
    if is_causal:
        vis = np.tril(vis)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == bool:
            vis = vis & m
        else:
            s = s + m.astype(np.float64)
    vis = np.broadcast_to(vis, s.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(vis, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        p = np.where(vis, np.exp(s - np.where(np.isneginf(top), 0.0, top)), 0.0)
        total = p.sum(axis=-1, keepdims=True)
        w = p / np.where(total == 0, 1.0, total)
        if dropout_p:
            w = np.where(_RNG.random(w.shape) >= dropout_p, w / (1.0 - dropout_p), 0.0)
        if np.isfinite(v).all():
            out = w @ v
        else:   # a zero weight contributes nothing even if its value row holds NaN or inf
            prod = w[..., None] * v[..., None, :, :]
            out = np.where(w[..., None] != 0, prod, 0.0).sum(axis=-2)
    return out.astype(out_dtype)
