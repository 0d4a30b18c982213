"""The bug catalogue: copies of the correct kernels with exactly one defect each.

Each kernel is the pipeline of `tests.kernels.correct.naive` (or `tiled`) with
one stage replaced by a defective one, as found in real fused kernels and
framework glue. The docstring names the defect and the clause it should trip;
`@bug(clause)` records that clause on the function and in `BUGS`. The suite
must fail on every one of them (tests/test_catalogue.py); a bug it misses is a
gap in a property or a strategy, never a reason to weaken the bug.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .correct import (BLOCK, apply_masks, check_shapes, compute_dtype, dropout, inputs, logits, softmax,
                      softmax_scale, weighted_values)

BUGS: dict[str, Callable] = {}


def bug(clause: str):
    """Register a buggy kernel and the clause it should trip (signature left untouched)."""
    def register(fn):
        fn.clause = clause
        BUGS[fn.__name__] = fn
        return fn
    return register


# ---- scale ----------------------------------------------------------------
@bug("ATTN-OP-4")
def no_scale(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the default 1/sqrt(d_k) scale is missing (custom scales are honoured). Trips ATTN-OP-4."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = (1.0 if scale is None else float(scale)) * (q @ k.transpose(-2, -1))
    s, vis = apply_masks(s, attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-4")
def scale_twice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the scale is applied to Q and again to the logits (scale**2). Trips ATTN-OP-4."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q * softmax_scale(q, scale), k, scale)
    s, vis = apply_masks(s, attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-3")
def scale_sqrt_dv(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the default scale is 1/sqrt(d_v) instead of 1/sqrt(d_k); wrong only when Dv != Dk. Trips ATTN-OP-3/ATTN-OP-4."""
    q, k, v = inputs(query, key, value, enable_gqa)
    sc = 1.0 / math.sqrt(v.shape[-1]) if scale is None else float(scale)
    s = sc * (q @ k.transpose(-2, -1))
    s, vis = apply_masks(s, attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-4")
def custom_scale_ignored(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the `scale` argument is ignored; 1/sqrt(d_k) is always used. Trips ATTN-OP-4."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q, k, None)
    s, vis = apply_masks(s, attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


# ---- softmax --------------------------------------------------------------
@bug("ATTN-OP-1")
def softmax_wrong_axis(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the softmax normalises over the query axis (dim=-2) instead of the key axis. Trips ATTN-OP-1 (and ATTN-W-1)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    s = torch.where(vis, s, -math.inf)
    m = s.amax(dim=-2, keepdim=True)
    p = torch.where(vis, torch.exp(s - torch.where(torch.isneginf(m), 0.0, m)), 0.0)
    l = p.sum(dim=-2, keepdim=True)
    w = p / torch.where(l == 0, 1.0, l)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


@bug("ATTN-TOL-3")
def no_max_subtraction(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: exp(s) without subtracting the row max; logits above ~88 (float32) overflow to inf/inf = NaN. Trips ATTN-TOL-3 (large-logit regime)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    p = torch.where(vis, torch.exp(torch.where(vis, s, -math.inf)), 0.0)
    l = p.sum(dim=-1, keepdim=True)
    w = p / torch.where(l == 0, 1.0, l)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


@bug("ATTN-TOL-1")
def low_precision_accumulation(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                               enable_gqa=False):
    """Defect: the reductions over keys (softmax sum and P@V) accumulate key by key in the input dtype
    (float16/bfloat16) instead of float32; the error grows with the row length. Trips ATTN-TOL-1 on long rows."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    s = torch.where(vis, s, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    p = torch.where(vis, torch.exp(s - torch.where(torch.isneginf(m), 0.0, m)), 0.0)
    t = query.dtype
    l = torch.zeros_like(m, dtype=t)
    acc = torch.zeros((*p.shape[:-1], v.shape[-1]), dtype=t)
    keep = dropout(torch.ones_like(p), dropout_p)
    for j in range(p.shape[-1]):
        l = l + p[..., j:j + 1].to(t)
        acc = acc + (p[..., j:j + 1] * keep[..., j:j + 1] * v[..., j:j + 1, :]).to(t)
    l = l.to(p.dtype)
    return (acc.to(p.dtype) / torch.where(l == 0, 1.0, l)).to(query.dtype)


@bug("ATTN-W-1")
def denominator_includes_masked(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                enable_gqa=False):
    """Defect: masked keys are dropped from the numerator but still summed in the softmax denominator,
    so rows with masked keys no longer sum to 1. Trips ATTN-W-1 / ATTN-MASK-3."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    m = s.amax(dim=-1, keepdim=True)
    p_all = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
    l = p_all.sum(dim=-1, keepdim=True)
    w = torch.where(vis, p_all, 0.0) / torch.where(l == 0, 1.0, l)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


# ---- masks ----------------------------------------------------------------
@bug("ATTN-MASK-1")
def inverted_bool_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: a bool mask is read as True = masked (the opposite polarity). Trips ATTN-MASK-1."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-2")
def float_mask_ignored(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: only bool masks are honoured; an additive float mask is silently dropped. Trips ATTN-MASK-2."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = None
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-3")
def mask_multiplies_logits(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                           enable_gqa=False):
    """Defect: masking multiplies the logits by 0 instead of setting them to -inf, so masked keys get
    weight exp(0 - max) and their values (NaN or huge ones included) leak into the output. Trips ATTN-MASK-3."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    s = torch.where(torch.isneginf(s), 0.0, s) * vis
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    w = p / p.sum(dim=-1, keepdim=True)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-5")
def batch0_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: batch 0's mask is used for every batch element (per-batch masks collapse). Trips ATTN-MASK-5."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dim() == 4:
        attn_mask = attn_mask[:1]
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-1")
def mask_wrong_axis(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: a key-padding mask (query axis of size 1, e.g. (B, 1, 1, Lk)) is transposed and applied
    along the query axis, masking queries instead of keys. Trips ATTN-MASK-1 (broadcast mask shapes)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dim() >= 2 and attn_mask.shape[-2] == 1 and attn_mask.shape[-1] > 1:
        attn_mask = attn_mask.transpose(-2, -1)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-4")
def query_length_off_by_one(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                            enable_gqa=False):
    """Defect: the kernel derives each batch element's query length from the mask (as varlen kernels do)
    as the index of the last row with a visible key, not index + 1, so the last real query row outputs 0.
    Trips ATTN-MASK-4 (and any masked case whose last row is visible)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    out = weighted_values(dropout(softmax(s, vis), dropout_p), v)
    if attn_mask is not None:
        rows = vis.any(dim=-1).any(dim=1)                       # (B, Lq): row has a visible key in some head
        idx = torch.arange(rows.shape[-1])
        q_len = torch.where(rows, idx, -1).amax(dim=-1)          # should be amax + 1
        keep = idx[None, :] < q_len[:, None]
        out = out * keep[:, None, :, None]
    return out.to(query.dtype)


# ---- causal ---------------------------------------------------------------
@bug("ATTN-CAUSAL-1")
def causal_strict(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: causal visibility is j < i instead of j <= i (the diagonal is masked; row 0 sees nothing). Trips ATTN-CAUSAL-1."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q, k, scale)
    causal = torch.ones(s.shape[-2:], dtype=torch.bool).tril(-1) if is_causal else None
    s, vis = apply_masks(s, attn_mask, False, causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-CAUSAL-1")
def causal_bottom_right(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
    """Defect: `is_causal` is aligned bottom-right (j <= i + Lk - Lq) where the convention is top-left;
    identical when Lq == Lk. Trips ATTN-CAUSAL-1 on cross-attention shapes."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q, k, scale)
    lq, lk = s.shape[-2:]
    causal = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq) if is_causal else None
    s, vis = apply_masks(s, attn_mask, False, causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


# ---- fully-masked rows ----------------------------------------------------
@bug("ATTN-EMPTY-1")
def empty_row_nan(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: the softmax has no guard for rows with no visible key: exp(-inf - -inf) gives NaN. Trips ATTN-EMPTY-1."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    s = torch.where(vis, s, -math.inf)
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    w = p / p.sum(dim=-1, keepdim=True)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


@bug("ATTN-EMPTY-1")
def empty_row_mean(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: masked logits are set to a large finite negative (-1e30) instead of -inf, so a row with no
    visible key gets uniform weights and outputs the mean of V. Trips ATTN-EMPTY-1."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    s = torch.where(vis, s, -1e30)
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    w = p / p.sum(dim=-1, keepdim=True)
    return weighted_values(dropout(w, dropout_p), v).to(query.dtype)


# ---- heads and shapes -----------------------------------------------------
@bug("ATTN-GQA-1")
def gqa_tile(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: KV heads are tiled (h -> h % Hkv) instead of repeat_interleaved (h -> h // group). Trips ATTN-GQA-1 when 1 < Hkv < Hq."""
    check_shapes(query, key, value, enable_gqa)
    t = compute_dtype(query.dtype)
    g = query.shape[1] // key.shape[1]
    q, k, v = query.to(t), key.to(t).repeat(1, g, 1, 1), value.to(t).repeat(1, g, 1, 1)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-2")
def heads_transposed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: glue reshapes (B, L, H, D) back to (B, H, L, D) without transposing, scrambling heads and
    positions whenever H > 1 and L > 1. Trips ATTN-OP-2."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    out = weighted_values(dropout(softmax(s, vis), dropout_p), v)
    return out.transpose(1, 2).reshape(out.shape).to(query.dtype)


# ---- dropout --------------------------------------------------------------
@bug("ATTN-DROP-2")
def dropout_no_rescale(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: dropped weights are zeroed but the kept ones are not rescaled by 1/(1-p), so the expected
    output shrinks by (1-p). Trips ATTN-DROP-2."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    w = softmax(s, vis)
    if dropout_p:
        w = torch.where(torch.rand_like(w) >= dropout_p, w, 0.0)
    return weighted_values(w, v).to(query.dtype)


@bug("ATTN-DROP-2")
def dropout_ignored(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: `dropout_p` is ignored (no weight is ever dropped). The expected output is still right, so
    only a check that weights are actually dropped (variance, or zero weights) can trip ATTN-DROP-2."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(softmax(s, vis), v).to(query.dtype)


# ---- tiled (online softmax) kernels -----------------------------------------
def _tiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *, rescale_acc: bool,
           full_blocks_only: bool):
    """The body of correct.tiled with one switch per defect below (both False = correct)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    sc = softmax_scale(q, scale)
    lq, lk = q.shape[-2], k.shape[-2]
    mask = None if attn_mask is None else attn_mask.broadcast_to((*q.shape[:-2], lq, lk))
    causal = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril() if is_causal else None
    m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    stop = lk - lk % BLOCK if full_blocks_only and lk > BLOCK else lk
    for j0 in range(0, stop, BLOCK):
        j1 = min(j0 + BLOCK, lk)
        s = sc * (q @ k[..., j0:j1, :].transpose(-2, -1))
        s, vis = apply_masks(s, None if mask is None else mask[..., j0:j1],
                             False, None if causal is None else causal[:, j0:j1])
        s = torch.where(vis, s, -math.inf)            # the running max is over visible keys only
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True).detach())
        m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.where(vis, torch.exp(s - m_safe), 0.0)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = (acc * alpha if rescale_acc else acc) + weighted_values(dropout(p, dropout_p), v[..., j0:j1, :])
        m = m_new
    return (acc / torch.where(l == 0, 1.0, l)).to(query.dtype)


@bug("ATTN-OP-1")
def online_no_rescale(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect (tiled kernel): on a new running max the sum is rescaled but the output accumulator is not.
    Wrong only when a later key block raises the row max (Lk > 16). Trips ATTN-OP-1 / ATTN-TOL-1."""
    return _tiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                  rescale_acc=False, full_blocks_only=False)


@bug("ATTN-OP-3")
def drops_partial_block(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
    """Defect (tiled kernel): when a row spans more than one key block, the partial last block is skipped,
    ignoring keys beyond the last multiple of 16. Wrong only when Lk > 16 and Lk % 16 != 0. Trips ATTN-OP-3 / ATTN-OP-1."""
    return _tiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                  rescale_acc=True, full_blocks_only=True)
