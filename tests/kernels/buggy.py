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

from .correct import (BLOCK, apply_masks, check_shapes, compute_dtype, dropout, inputs, logits, naive, softmax,
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


# ---- found by red-teaming the suite (each was missed before the gap it names was closed) ------------
@bug("ATTN-OP-8")
def mask_scaled_in_place(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """Defect: a float mask is divided by the scale in place (so that (QK^T + mask') * scale can be one fused
    step): the output is right, the caller's mask is not. Trips ATTN-OP-8."""
    q, k, v = inputs(query, key, value, enable_gqa)
    sc = softmax_scale(q, scale)
    s = q @ k.transpose(-2, -1)
    if attn_mask is not None and attn_mask.dtype != torch.bool and sc != 0:
        attn_mask.div_(sc)
        s, vis = apply_masks(s, attn_mask, is_causal)
        s = s * sc
    else:
        s, vis = apply_masks(s * sc, attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-8")
def reads_inputs_as_contiguous(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                               enable_gqa=False):
    """Defect: Q, K and V are read as contiguous memory from their first element, whatever their strides (a
    raw-pointer kernel without a stride check): wrong for a transposed (B, L, H, D) view or an expanded K/V.
    Trips ATTN-OP-8."""
    def raw(t):
        strides = [1] * t.dim()
        for i in range(t.dim() - 2, -1, -1):
            strides[i] = strides[i + 1] * t.shape[i + 1]
        return torch.as_strided(t, t.shape, strides, t.storage_offset())
    return naive(raw(query), raw(key), raw(value), attn_mask, dropout_p, is_causal, scale, enable_gqa)


@bug("ATTN-GQA-1")
def gqa_kv_head_mod4(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: query head h reads KV head (h // group) % 4, from a kernel tuned for at most four KV heads:
    wrong only when Hkv > 4 (e.g. 16 query heads over 8 KV heads). Trips ATTN-GQA-1."""
    hq, hk = query.shape[1], key.shape[1]
    if hk > 4 and hq != hk:
        idx = torch.tensor([(h // (hq // hk)) % 4 for h in range(hq)])
        key, value = key[:, idx], value[:, idx]
    return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa and hk <= 4)


@bug("ATTN-OP-1")
def split_kv_merge_without_sums(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                enable_gqa=False):
    """Defect: short query blocks (2 <= Lq <= 16) over long histories (Lk >= 512) take a split-KV path that
    merges the chunks' normalised outputs by their maxima alone, forgetting each chunk's softmax sum.
    Trips ATTN-OP-1."""
    lq, lk = query.shape[-2], key.shape[-2]
    if not (2 <= lq <= 16 and lk >= 512) or dropout_p:
        return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    outs, maxes = [], []
    for j0 in range(0, lk, 256):
        sj, vj = s[..., j0:j0 + 256], vis[..., j0:j0 + 256]
        outs.append(weighted_values(softmax(sj, vj), v[..., j0:j0 + 256, :]))
        maxes.append(torch.where(vj, sj, -math.inf).amax(dim=-1, keepdim=True))
    m = torch.stack(maxes).amax(dim=0)
    m = torch.where(torch.isneginf(m), 0.0, m)
    wts = [torch.exp(x - m) for x in maxes]
    total = sum(wts)
    out = sum(w * o for w, o in zip(wts, outs)) / torch.where(total == 0, 1.0, total)
    return out.to(query.dtype)


@bug("ATTN-OP-1")
def wide_head_no_rescale(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """Defect: heads wider than 128 take a tiled path whose accumulator is not rescaled on a new running max
    (narrower heads are right): wrong only when Dk > 128 and a later key block raises a row's max.
    Trips ATTN-OP-1."""
    if query.shape[-1] <= 128:
        return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _tiled(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                  rescale_acc=False, full_blocks_only=False)


@bug("ATTN-OP-4")
def scale_zero_means_default(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False):
    """Defect: `scale or 1/sqrt(Dk)`: a given scale of 0 becomes the default (the output should average the
    visible values). Trips ATTN-OP-4."""
    return naive(query, key, value, attn_mask, dropout_p, is_causal, scale or None, enable_gqa)


@bug("ATTN-TOL-3")
def bf16_output_through_fp16(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False):
    """Defect: the bfloat16 output is stored through a float16 buffer: inf wherever |out| > 65504, and 3 fewer
    exponent bits below. Seen only with large values. Trips ATTN-TOL-3."""
    out = naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return out.to(torch.float16).to(torch.bfloat16) if query.dtype == torch.bfloat16 else out


class _DqFromLastKeyBlock(torch.autograd.Function):
    """out = naive(q, k, v); its backward stores dQ block by block over 128 keys, overwriting instead of
    accumulating: dQ keeps only the last block's share."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, is_causal, scale, enable_gqa):
        ctx.save_for_backward(q, k, v)
        ctx.args = (attn_mask, is_causal, scale, enable_gqa)
        return naive(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v = ctx.saved_tensors
        mask, is_causal, scale, gqa = ctx.args
        with torch.enable_grad():
            q1, k1, v1 = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = naive(q1, k1, v1, mask, 0.0, is_causal, scale, gqa)
            dq, dk, dv = torch.autograd.grad(out, (q1, k1, v1), d_out)
            lk = k.shape[-2]
            if lk > 128:   # dQ as if the keys before the last block were zero vectors
                k_seen = k.detach().clone()
                k_seen[..., :(lk - 1) // 128 * 128, :] = 0.0
                q2 = q.detach().requires_grad_(True)
                dq, = torch.autograd.grad(naive(q2, k_seen, v.detach(), mask, 0.0, is_causal, scale, gqa), (q2,), d_out)
        return dq, dk, dv, None, None, None, None


@bug("ATTN-GRAD-1")
def dq_from_last_key_block(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                           enable_gqa=False):
    """Defect (backward only): dQ is written per 128-key block instead of accumulated, so with Lk > 128 it
    holds the gradient computed as if the earlier keys were zero vectors. Trips ATTN-GRAD-1 / ATTN-TOL-5."""
    if dropout_p:
        return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _DqFromLastKeyBlock.apply(query, key, value, attn_mask, is_causal, scale, enable_gqa)


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


# ---- dropout: rescale, independence, backward -----------------------------------
@bug("ATTN-DROP-2")
def dropout_inverse_p(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: kept weights are rescaled by 1/p instead of 1/(1-p). Right at p = 0.5 only, where the two
    agree; elsewhere every kept weight is off by (1-p)/p. Trips ATTN-DROP-2."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    w = softmax(s, vis)
    if dropout_p:
        w = torch.where(torch.rand_like(w) >= dropout_p, w / dropout_p, 0.0)
    return weighted_values(w, v).to(query.dtype)


@bug("ATTN-DROP-2")
def dropout_shared_across_heads(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                enable_gqa=False):
    """Defect: one (B, 1, Lq, Lk) keep mask is drawn and broadcast over the heads (a random offset that
    ignores the head index), so every head drops the same weights. Each head alone is right: the keep rate
    and the expectation are those of correct dropout. Trips ATTN-DROP-2 (independence)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    w = softmax(s, vis)
    if dropout_p:
        keep = torch.rand((w.shape[0], 1, *w.shape[2:]), dtype=w.dtype, device=w.device) >= dropout_p
        w = torch.where(keep, w / (1.0 - dropout_p), 0.0)
    return weighted_values(w, v).to(query.dtype)


class _FreshMaskBackward(torch.autograd.Function):
    """naive's forward with dropout; a backward that recomputes the weights and draws a new keep mask."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        ctx.save_for_backward(query, key, value)
        ctx.args = (attn_mask, dropout_p, is_causal, scale, enable_gqa)
        q, k, v = inputs(query, key, value, enable_gqa)
        s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
        return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value = ctx.saved_tensors
        attn_mask, dropout_p, is_causal, scale, enable_gqa = ctx.args
        with torch.enable_grad():
            xs = [t.detach().requires_grad_(True) for t in (query, key, value)]
            q, k, v = inputs(*xs, enable_gqa)
            s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
            out = weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)   # a second draw
            grads = torch.autograd.grad(out, xs, grad_out)
        return (*grads, None, None, None, None, None)


@bug("ATTN-DROP-3")
def dropout_backward_fresh_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                enable_gqa=False):
    """Defect: the backward recomputes the weights and applies dropout again with a fresh draw instead of
    replaying the forward's keep mask (the RNG state is not saved). The forward is correct dropout and the
    gradients are right in expectation, but not those of the output returned. Trips ATTN-DROP-3."""
    if dropout_p and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return _FreshMaskBackward.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q, k, v = inputs(query, key, value, enable_gqa)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


# ---- found by the second red-team round (2026-11-25; each was missed before its pin) ----------------------
@bug("ATTN-MASK-1")
def mask3d_as_batch(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Defect: a 3-D attn_mask whose leading size equals B is read per batch element, (B, 1, Lq, Lk), where torch
    broadcasts it right-aligned as (1, X, Lq, Lk) over heads. Trips ATTN-MASK-1 (broadcast mask shapes)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if attn_mask is not None and attn_mask.dim() == 3 and attn_mask.shape[0] == query.shape[0]:
        attn_mask = attn_mask.unsqueeze(1)
    s, vis = apply_masks(logits(q, k, scale), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-OP-4")
def scale_split_sqrt_abs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """Defect: the scale is split as sqrt(|scale|) onto Q and K, so a negative scale loses its sign (right for
    every scale >= 0). Trips ATTN-OP-4 (a negative scale is allowed)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    r = math.sqrt(abs(softmax_scale(q, scale)))
    s, vis = apply_masks((r * q) @ (r * k).transpose(-2, -1), attn_mask, is_causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-CAUSAL-1")
def causal_query_block_512(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                           enable_gqa=False):
    """Defect: queries are processed in blocks of 512 rows and the causal diagonal uses the row index within
    the block, so rows 512 and up see only the first (i - 512) keys. Trips ATTN-CAUSAL-1 (only for Lq > 512)."""
    q, k, v = inputs(query, key, value, enable_gqa)
    s = logits(q, k, scale)
    lq, lk = s.shape[-2:]
    causal = None
    if is_causal:
        i = torch.arange(lq)[:, None] % 512
        causal = torch.arange(lk)[None, :] <= i
    s, vis = apply_masks(s, attn_mask, False, causal)
    return weighted_values(dropout(softmax(s, vis), dropout_p), v).to(query.dtype)


@bug("ATTN-MASK-5")
def mask_batch_chunks_of_4(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                           enable_gqa=False):
    """Defect: the batch runs in chunks of 4 with the mask left unsliced, so batch element b uses mask[b % 4]
    (right for B <= 4). Trips ATTN-MASK-5 (per-batch masks)."""
    outs = []
    for b0 in range(0, query.shape[0], 4):
        m = attn_mask
        if m is not None and m.dim() == 4 and m.shape[0] > 1:
            m = m[:min(4, query.shape[0] - b0)]
        q, k, v = inputs(query[b0:b0 + 4], key[b0:b0 + 4], value[b0:b0 + 4], enable_gqa)
        s, vis = apply_masks(logits(q, k, scale), m, is_causal)
        outs.append(weighted_values(dropout(softmax(s, vis), dropout_p), v))
    return torch.cat(outs).to(query.dtype)
