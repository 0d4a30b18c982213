"""Two honest SDPA kernels in plain torch ops: the controls of the bug catalogue.

`naive` materialises the whole score matrix; `tiled` walks the keys in blocks
with an online softmax (running max and sum, accumulator rescaled on a new
max), the way fused kernels do. Both follow the torch SDPA convention
(see adapters/sdpa_convention.py) and the spec: bool mask True = attend, float
mask added to the scaled logits, top-left `is_causal`, repeat_interleave GQA
grouping, rows with no visible key output 0, and dropout keeps each weight with
probability 1-p and rescales it by 1/(1-p). Like real kernels they compute in
float32 for float16/bfloat16 inputs and return the input dtype.

The stages are small functions so that `tests.kernels.buggy` can copy the
pipeline and replace exactly one stage with a defective one.
"""
from __future__ import annotations

import math

import torch

BLOCK = 16  # key block of the tiled kernel (small, so that short rows span several blocks)


def naive(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Reference-shaped attention: scores, masked max-subtracted softmax, dropout, weighted values."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q, k, scale)
    s, vis = apply_masks(s, attn_mask, is_causal)
    w = softmax(s, vis)
    w = dropout(w, dropout_p)
    return weighted_values(w, v).to(query.dtype)


def tiled(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Online softmax over key blocks of BLOCK, as flash-style kernels do."""
    q, k, v = inputs(query, key, value, enable_gqa)
    sc = softmax_scale(q, scale)
    lq, lk = q.shape[-2], k.shape[-2]
    mask = None if attn_mask is None else attn_mask.broadcast_to((*q.shape[:-2], lq, lk))
    causal = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril() if is_causal else None
    m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    for j0 in range(0, lk, BLOCK):
        j1 = min(j0 + BLOCK, lk)
        s = sc * (q @ k[..., j0:j1, :].transpose(-2, -1))
        s, vis = apply_masks(s, None if mask is None else mask[..., j0:j1],
                             False, None if causal is None else causal[:, j0:j1])
        s = torch.where(vis, s, -math.inf)            # the running max is over visible keys only
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True).detach())
        m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        alpha = torch.exp(m - m_safe)                 # rescales what was summed under the old max
        p = torch.where(vis, torch.exp(s - m_safe), 0.0)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + weighted_values(dropout(p, dropout_p), v[..., j0:j1, :])
        m = m_new
    return (acc / torch.where(l == 0, 1.0, l)).to(query.dtype)


# ---- the stages -----------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything narrower is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_shapes(query, key, value, enable_gqa) -> None:
    """Raise ValueError on shapes that are not an attention problem (ATTN-OP-6)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"expected 4-D (B, H, L, D) inputs; got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    (b, hq, _, dk), (bk, hk, lk, dk2), (bv, hv, lv, _) = query.shape, key.shape, value.shape
    if not b == bk == bv:
        raise ValueError(f"batch sizes differ: {b}, {bk}, {bv}")
    if dk != dk2:
        raise ValueError(f"query and key head dims differ: {dk} vs {dk2}")
    if (hk, lk) != (hv, lv):
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in heads or length")
    if hk == 0 or hq % hk or (hq != hk and not enable_gqa):
        raise ValueError(f"{hq} query heads cannot use {hk} key/value heads (enable_gqa={enable_gqa})")


def inputs(query, key, value, enable_gqa):
    """Validated inputs in the compute dtype, KV heads repeated to the query heads."""
    check_shapes(query, key, value, enable_gqa)
    t = compute_dtype(query.dtype)
    q, k, v = query.to(t), key.to(t), value.to(t)
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return q, k, v


def softmax_scale(q, scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def logits(q, k, scale):
    return softmax_scale(q, scale) * (q @ k.transpose(-2, -1))


def apply_masks(s, attn_mask, is_causal, causal=None):
    """(logits with the float mask added, visibility): bool mask True = attend, -inf = masked."""
    lq, lk = s.shape[-2:]
    vis = torch.ones(lq, lk, dtype=torch.bool, device=s.device)
    if is_causal:
        vis = vis.tril()                               # top-left: key j visible to query i iff j <= i
    if causal is not None:
        vis = vis & causal
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            vis = vis & attn_mask
        else:
            s = s + attn_mask.to(s.dtype)
            vis = vis & ~torch.isneginf(attn_mask)
    return s, vis.broadcast_to(s.shape)


def softmax(s, vis):
    """Max-subtracted softmax over visible keys; rows with no visible key get weight 0."""
    s = torch.where(vis, s, -math.inf)
    m = s.amax(dim=-1, keepdim=True).detach()          # any shift gives the same softmax
    p = torch.where(vis, torch.exp(s - torch.where(torch.isneginf(m), 0.0, m)), 0.0)
    l = p.sum(dim=-1, keepdim=True)
    return p / torch.where(l == 0, 1.0, l)             # NaN in a visible logit stays NaN


def dropout(w, p: float):
    """Keep each weight with probability 1-p and rescale the kept ones by 1/(1-p)."""
    if not p:
        return w
    keep = torch.rand_like(w) >= p
    return torch.where(keep, w / (1.0 - p), 0.0)


def weighted_values(w, v):
    """w @ v, where a zero weight contributes nothing even if its value row holds NaN or inf."""
    if bool(torch.isfinite(v).all()):
        return w @ v
    prod = w.unsqueeze(-1) * v.unsqueeze(-3)
    return torch.where(w.unsqueeze(-1) != 0, prod, 0.0).sum(dim=-2)
