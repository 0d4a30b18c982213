"""The float64 oracle: scaled dot-product attention exactly as spec/SPEC.md defines it.

Written for clarity first, then for speed on the small cases the suite generates:
dense (B, Hq, Lq, Lk) arrays, a max-subtracted softmax that never overflows for
finite inputs, and explicit visibility so that masked positions cannot leak
(ATTN-MASK-3) even when they hold huge values or NaN.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .case import Case


class Forward(NamedTuple):
    out: np.ndarray        # (B, Hq, Lq, Dv)
    weights: np.ndarray    # (B, Hq, Lq, Lk), exactly 0 where invisible
    lse: np.ndarray        # (B, Hq, Lq), -inf for rows with no visible key
    logits: np.ndarray     # (B, Hq, Lq, Lk) scaled logits plus bias (before masking)
    visible: np.ndarray    # (B, Hq, Lq, Lk) bool


def causal_visible(lq: int, lk: int, causal: str | None, q_len=None, kv_len=None) -> np.ndarray:
    """Causal visibility (ATTN-CAUSAL-1) for one batch element, shape (Lq, Lk)."""
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    if causal is None:
        return np.ones((lq, lk), dtype=bool)
    if causal == "top_left":
        return j <= i
    if causal == "bottom_right":
        offset = (lk if kv_len is None else kv_len) - (lq if q_len is None else q_len)
        return j <= i + offset
    raise ValueError(f"causal must be None, 'top_left' or 'bottom_right'; got {causal!r}")


def diagonal_offset(lq: int, lk: int, align: str, q_len=None, kv_len=None) -> int:
    """Where query i's diagonal key sits: j = i + offset (0 top-left; kv_len - q_len bottom-right)."""
    if align == "top_left":
        return 0
    if align == "bottom_right":
        return (lk if kv_len is None else kv_len) - (lq if q_len is None else q_len)
    raise ValueError(f"alignment must be 'top_left' or 'bottom_right'; got {align!r}")


def window_visible(lq: int, lk: int, window: tuple[int, int], align: str, q_len=None, kv_len=None) -> np.ndarray:
    """Sliding-window visibility (ATTN-WIN-1) for one batch element, shape (Lq, Lk): key j is visible to
    query i iff i + off - left <= j <= i + off + right, both bounds inclusive, -1 meaning unbounded."""
    left, right = window
    i = np.arange(lq)[:, None] + diagonal_offset(lq, lk, align, q_len, kv_len)
    j = np.arange(lk)[None, :]
    vis = np.ones((lq, lk), dtype=bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def chunk_visible(lq: int, lk: int, chunk: int, align: str, q_len=None, kv_len=None) -> np.ndarray:
    """Chunked local attention (ATTN-CHUNK-1) for one batch element, shape (Lq, Lk): the keys are cut into
    chunks of `chunk` positions counted from key 0, and query i sees the keys of the chunk holding its
    aligned position i + off (flash-attention 3's attention_chunk, Llama 4)."""
    i = np.arange(lq)[:, None] + diagonal_offset(lq, lk, align, q_len, kv_len)
    j = np.arange(lk)[None, :]
    return (j // chunk) == np.floor_divide(i, chunk)


def alibi_bias(shape: tuple[int, int, int, int], slopes: np.ndarray, align: str,
               q_lengths=None, kv_lengths=None) -> np.ndarray:
    """The ALiBi bias (ATTN-ALIBI-1): -slope[b, h] * |i + off_b - j|, shape (B, Hq, Lq, Lk)."""
    B, Hq, Lq, Lk = shape
    sl = np.broadcast_to(np.asarray(slopes, dtype=np.float64).reshape((-1, Hq) if np.ndim(slopes) == 2 else (1, Hq)),
                         (B, Hq))
    out = np.empty(shape)
    for b in range(B):
        ql = None if q_lengths is None else int(q_lengths[b])
        kl = None if kv_lengths is None else int(kv_lengths[b])
        dist = np.abs(np.arange(Lq)[:, None] + diagonal_offset(Lq, Lk, align, ql, kl) - np.arange(Lk)[None, :])
        out[b] = -sl[b][:, None, None] * dist
    return out


def visibility(shape: tuple[int, int, int, int], *, mask=None, bias=None, causal=None,
               q_lengths=None, kv_lengths=None, window=None, window_align="bottom_right",
               chunk=None) -> np.ndarray:
    """Which keys each query may see (ATTN-MASK-1, -2, -4, -6, ATTN-CAUSAL-1, ATTN-WIN-1): (B, Hq, Lq, Lk) bool."""
    B, Hq, Lq, Lk = shape
    vis = np.ones(shape, dtype=bool)
    if mask is not None:
        vis &= np.broadcast_to(np.asarray(mask, dtype=bool), shape)
    if bias is not None:
        vis &= ~np.isneginf(np.broadcast_to(bias, shape))
    for b in range(B):
        ql = None if q_lengths is None else int(q_lengths[b])
        kl = None if kv_lengths is None else int(kv_lengths[b])
        if causal is not None:
            vis[b] &= causal_visible(Lq, Lk, causal, ql, kl)
        if window is not None:
            vis[b] &= window_visible(Lq, Lk, window, window_align, ql, kl)
        if chunk is not None:
            vis[b] &= chunk_visible(Lq, Lk, chunk, window_align, ql, kl)
        if kl is not None:
            vis[b, :, :, kl:] = False
        if ql is not None:
            vis[b, :, ql:, :] = False
    return vis


def expand_kv(x: np.ndarray, hq: int) -> np.ndarray:
    """Repeat KV heads to Hq heads with the repeat_interleave grouping (ATTN-GQA-1)."""
    g = hq // x.shape[1]
    return x if g == 1 else np.repeat(x, g, axis=1)


def forward(q, k, v, *, mask=None, bias=None, causal=None, scale=None,
            q_lengths=None, kv_lengths=None, window=None, window_align="bottom_right",
            softcap=None, alibi_slopes=None, sinks=None, chunk=None) -> Forward:
    """Output, weights, log-sum-exp, logits and visibility in float64.

    logits = softcap(scale Q K^T) + alibi + bias, where softcap(x) = c tanh(x / c) (ATTN-CAP-1);
    a sink logit (ATTN-SINK-1) adds exp(sink) to every row's denominator (and to its lse) but
    carries no value, so a row that sees no key still outputs 0 and its lse is the sink.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Lq, Dk = q.shape
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={k.shape[1]}")
    Lk = k.shape[2]
    s = 1.0 / np.sqrt(Dk) if scale is None else float(scale)
    ke, ve = expand_kv(k, Hq), expand_kv(v, Hq)
    with np.errstate(all="ignore"):
        logits = s * np.einsum("bhid,bhjd->bhij", q, ke, optimize=True)
        if softcap is not None:
            logits = softcap * np.tanh(logits / softcap)
        if alibi_slopes is not None:
            logits = logits + alibi_bias((B, Hq, Lq, Lk), alibi_slopes, window_align, q_lengths, kv_lengths)
        if bias is not None:
            logits = logits + np.asarray(bias, dtype=np.float64)
        vis = visibility((B, Hq, Lq, Lk), mask=mask, bias=bias, causal=causal,
                         q_lengths=q_lengths, kv_lengths=kv_lengths, window=window, window_align=window_align,
                         chunk=chunk)
        masked = np.where(vis, logits, -np.inf)
        m = masked.max(axis=-1, keepdims=True) if Lk else np.full((B, Hq, Lq, 1), -np.inf)
        if sinks is not None:
            m = np.maximum(m, np.asarray(sinks, dtype=np.float64)[None, :, None, None])
        m_safe = np.where(np.isneginf(m), 0.0, m)
        p = np.where(vis, np.exp(masked - m_safe), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        if sinks is not None:
            l = l + np.exp(np.asarray(sinks, dtype=np.float64)[None, :, None, None] - m_safe)
        w = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
        w = np.where(np.isnan(m), np.nan, w)  # a NaN logit in a visible position poisons the row
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l > 0, l, 1.0))[..., 0], -np.inf)
        lse = np.where(np.isnan(m[..., 0]), np.nan, lse)
        out = _weighted_values(w, ve, vis)
    return Forward(out, w, lse, logits, vis)


def _weighted_values(w: np.ndarray, ve: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """w @ V where invisible V rows contribute nothing, even if they hold NaN or inf."""
    bad = ~np.isfinite(ve)
    if not bad.any():
        return np.einsum("bhij,bhjd->bhid", w, ve, optimize=True)
    out = np.einsum("bhij,bhjd->bhid", w, np.where(bad, 0.0, ve), optimize=True)
    hit = np.einsum("bhij,bhjd->bhid", vis.astype(np.float64), bad.astype(np.float64)) > 0
    for b, h, i in zip(*np.nonzero(hit.any(axis=-1))):
        cols = vis[b, h, i]
        out[b, h, i] = (w[b, h, i, cols, None] * ve[b, h, cols]).sum(axis=0)
    return out


def attention(q, k, v, *, mask=None, bias=None, causal=None, scale=None,
              q_lengths=None, kv_lengths=None, return_weights: bool = False):
    """The spec's attention in float64: output (B, Hq, Lq, Dv), or (output, weights)."""
    f = forward(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                q_lengths=q_lengths, kv_lengths=kv_lengths)
    return (f.out, f.weights) if return_weights else f.out


def logsumexp(q, k, v, **params) -> np.ndarray:
    """The log-sum-exp of the visible scaled logits (ATTN-W-3), -inf for empty rows."""
    return forward(q, k, v, **params).lse


def case_params(case: Case) -> dict:
    return dict(mask=case.mask, bias=case.bias, causal=case.causal, scale=case.scale,
                q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                window_align=case.window_align, softcap=case.softcap, alibi_slopes=case.alibi_slopes,
                sinks=case.sinks, chunk=case.chunk)


def oracle(case: Case) -> Forward:
    """The reference forward for a Case, computed once per Case and cached on it."""
    cached = case._cache.get("oracle")
    if cached is None:
        cached = case._cache["oracle"] = forward(case.q, case.k, case.v, **case_params(case))
    return cached
