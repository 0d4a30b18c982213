"""Multi-head latent attention (DeepSeek V2/V3) in its two forms, in float64 (ATTN-MLA-1, -2).

Non-absorbed (prefill) form, per head h, with a shared latent c_j (d_c) and rope key r_j (d_r)
per key: k_j^h = [W_UK^h c_j ; r_j], v_j^h = W_UV^h c_j, queries [q_nope^h ; q_rope^h].

Absorbed (decode) form: the up-projections move to the query and the output side,
q'^h = [W_UK^h^T q_nope^h ; q_rope^h] against the latent rows [c_j ; r_j] (d_c + d_r = 576 in
DeepSeek V3), with the value the first d_c = 512 dims of the same row, and out^h = W_UV^h o'^h.
Since q'.[c ; r] = q_nope.(W_UK c) + q_rope.r and W_UV (sum_j p_j c_j) = sum_j p_j W_UV c_j,
both give the same weights, lse and output (ATTN-MLA-2). The scale is the non-absorbed
head dim's, 1/sqrt(d_nope + d_r), in both (the absorbed kernel is given it explicitly).
"""
from __future__ import annotations

import numpy as np

from .attention import Forward, forward


def latent_attention(q: np.ndarray, rows: np.ndarray, d_v: int, **params) -> Forward:
    """The absorbed form: q (B, H, Lq, D) against latent rows (B, Hkv, Lk, D), values rows[..., :d_v]."""
    rows = np.asarray(rows, dtype=np.float64)
    if not 0 < d_v <= rows.shape[-1]:
        raise ValueError(f"d_v = {d_v} must lie in 1..{rows.shape[-1]} (the value is a prefix of the latent row)")
    return forward(q, rows, rows[..., :d_v], **params)


def non_absorbed(q_nope, q_rope, c, k_rope, w_uk, w_uv, **params) -> Forward:
    """q_nope (B, H, Lq, d_n), q_rope (B, H, Lq, d_r), c (B, Lk, d_c), k_rope (B, Lk, d_r),
    w_uk (H, d_n, d_c), w_uv (H, d_v, d_c): attention with per-head keys and values expanded."""
    k_nope = np.einsum("hnc,bjc->bhjn", w_uk, c)
    H = w_uk.shape[0]
    k = np.concatenate([k_nope, np.broadcast_to(k_rope[:, None], k_nope.shape[:3] + (k_rope.shape[-1],))], axis=-1)
    v = np.einsum("hvc,bjc->bhjv", w_uv, c)
    q = np.concatenate([q_nope, q_rope], axis=-1)
    if q.shape[1] != H:
        raise ValueError(f"q has {q.shape[1]} heads, the projections {H}")
    return forward(q, k, v, **params)


def absorbed(q_nope, q_rope, c, k_rope, w_uk, w_uv, **params) -> Forward:
    """The same attention computed in the absorbed form: one latent row per key shared by every head."""
    q_lat = np.concatenate([np.einsum("hnc,bhin->bhic", w_uk, q_nope), q_rope], axis=-1)
    rows = np.concatenate([c, k_rope], axis=-1)[:, None]                 # (B, 1, Lk, d_c + d_r)
    params.setdefault("scale", 1.0 / np.sqrt(q_nope.shape[-1] + q_rope.shape[-1]))
    f = latent_attention(q_lat, rows, c.shape[-1], **params)
    out = np.einsum("hvc,bhic->bhiv", w_uv, f.out)
    return Forward(out, f.weights, f.lse, f.logits, f.visible)
