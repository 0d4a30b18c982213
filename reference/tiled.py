"""A tiled float64 forward for long sequences and decode (ATTN-LONG-1, ATTN-DECODE-1, ATTN-PROP-7).

The dense oracle holds (B, Hq, Lq, Lk) arrays, which at L = 32768 is 8 GiB per
head. This form visits (query block, key block) tiles with the online softmax: a
running row maximum m, a running sum l of exp(s - m) and an accumulator rescaled by
exp(m_old - m_new) whenever the maximum grows. Memory is O((Lq + Lk) D + block_q *
block_k) per (batch, head) (all heads' tiles are processed together); the result
equals the dense softmax up to float64 rounding.

Supported are the masks that need no O(L^2) storage: causal (top_left, bottom_right),
padding lengths, the sliding window of ATTN-WIN-1 (either alignment; tiles outside
every row's window are skipped, so a windowed pass costs O(L * window)), and the
logit transforms softcap (ATTN-CAP-1) and ALiBi (ATTN-ALIBI-1), computed per tile in
the order the spec fixes: cap the scaled logits, then add the ALiBi bias. A sink
(ATTN-SINK-1) joins each row's running sum once, after the last tile, exactly as an
extra key that carries no value. GQA query heads share their KV head without copying
it. Rows that see no key give output 0 and lse -inf, or lse = sink with a sink
(ATTN-EMPTY-1, -2, ATTN-SINK-3).
"""
from __future__ import annotations

import numpy as np

from .attention import diagonal_offset


def _offsets(align: str, q_lens: np.ndarray, kv_lens: np.ndarray, lq: int, lk: int) -> np.ndarray:
    """Per batch element, the diagonal offset of ATTN-WIN-2 / ATTN-CAUSAL-1 for `align`."""
    return np.array([diagonal_offset(lq, lk, align, int(ql), int(kl)) for ql, kl in zip(q_lens, kv_lens)],
                    dtype=np.int64)


def _tile_empty(i0: int, i1: int, j0: int, j1: int, causal: str | None, q_lens: np.ndarray,
                kv_lens: np.ndarray, window, win_off: np.ndarray) -> bool:
    """True when, for every batch element, no pair of the tile is visible (decided from its corners)."""
    dead = (q_lens <= i0) | (kv_lens <= j0)
    if causal == "top_left":
        dead |= j0 > i1 - 1
    elif causal == "bottom_right":
        dead |= j0 > i1 - 1 + (kv_lens - q_lens)
    if window is not None:
        if window[0] >= 0:
            dead |= j1 - 1 < i0 + win_off - window[0]
        if window[1] >= 0:
            dead |= j0 > i1 - 1 + win_off + window[1]
    return bool(dead.all())


def _block_visible(i0: int, i1: int, j0: int, j1: int, causal: str | None,
                   q_lens: np.ndarray, kv_lens: np.ndarray, window=None,
                   win_off: np.ndarray | None = None) -> np.ndarray | None:
    """(B, bq, bk) visibility of one tile, or None when every pair is visible."""
    if (q_lens >= i1).all() and (kv_lens >= j1).all():
        # the tile's last key against its first query decides whether causality hides anything;
        # the window's bounds are checked at the tile's corners the same way
        causal_free = causal is None or (causal == "top_left" and j1 - 1 <= i0) or (
            causal == "bottom_right" and (j1 - 1 <= i0 + (kv_lens - q_lens)).all())
        window_free = window is None or (
            (window[0] < 0 or (j0 >= i1 - 1 + win_off - window[0]).all())
            and (window[1] < 0 or (j1 - 1 <= i0 + win_off + window[1]).all()))
        if causal_free and window_free:
            return None
    i = np.arange(i0, i1)[None, :, None]
    j = np.arange(j0, j1)[None, None, :]
    ql, kl = q_lens[:, None, None], kv_lens[:, None, None]
    vis = (i < ql) & (j < kl)
    if causal == "top_left":
        vis &= j <= i
    elif causal == "bottom_right":
        vis &= j <= i + (kl - ql)
    elif causal is not None:
        raise ValueError(f"causal must be None, 'top_left' or 'bottom_right'; got {causal!r}")
    if window is not None:
        d = i + win_off[:, None, None]
        if window[0] >= 0:
            vis &= j >= d - window[0]
        if window[1] >= 0:
            vis &= j <= d + window[1]
    return vis


def tiled_forward(q, k, v, *, causal: str | None = None, scale: float | None = None,
                  q_lengths=None, kv_lengths=None, window=None, window_align: str = "bottom_right",
                  softcap: float | None = None, alibi_slopes=None, sinks=None,
                  block_q: int = 256, block_k: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(out (B, Hq, Lq, Dv), lse (B, Hq, Lq)) in float64 by online softmax over tiles.

    The keywords mean what they mean in `reference.forward` (a boolean mask or a bias array is the one
    thing not supported: they are O(Lq Lk) by nature).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    g = Hq // Hkv
    s = 1.0 / np.sqrt(Dk) if scale is None else float(scale)
    q_lens = np.full(B, Lq) if q_lengths is None else np.asarray(q_lengths, dtype=np.int64)
    kv_lens = np.full(B, Lk) if kv_lengths is None else np.asarray(kv_lengths, dtype=np.int64)
    if window is not None:
        window = (int(window[0]), int(window[1]))
        if window == (-1, -1):
            window = None
    align_off = _offsets(window_align, q_lens, kv_lens, Lq, Lk)
    slopes = None
    if alibi_slopes is not None:
        sl = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = np.broadcast_to(sl.reshape((-1, Hq) if sl.ndim == 2 else (1, Hq)), (B, Hq)).reshape(B, Hkv, g)
    qg = q.reshape(B, Hkv, g, Lq, Dk)  # query heads grouped under their KV head
    out = np.empty((B, Hkv, g, Lq, Dv))
    lse = np.empty((B, Hkv, g, Lq))
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64).reshape(1, Hkv, g, 1)
    with np.errstate(all="ignore"):
        for i0 in range(0, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            qb = qg[:, :, :, i0:i1] * s
            m = np.full((B, Hkv, g, i1 - i0), -np.inf)
            l = np.zeros((B, Hkv, g, i1 - i0))
            acc = np.zeros((B, Hkv, g, i1 - i0, Dv))
            for j0 in range(0, Lk, block_k):
                j1 = min(j0 + block_k, Lk)
                if _tile_empty(i0, i1, j0, j1, causal, q_lens, kv_lens, window, align_off):
                    continue
                vis = _block_visible(i0, i1, j0, j1, causal, q_lens, kv_lens, window, align_off)
                if vis is not None and not vis.any():
                    continue
                kb, vb = k[:, :, None, j0:j1], v[:, :, None, j0:j1]
                t = np.matmul(qb, np.swapaxes(kb, -1, -2))  # (B, Hkv, g, bq, bk)
                if softcap is not None:
                    t = softcap * np.tanh(t / softcap)
                if slopes is not None:
                    dist = np.abs(np.arange(i0, i1)[None, :, None] + align_off[:, None, None]
                                  - np.arange(j0, j1)[None, None, :])                     # (B, bq, bk)
                    t = t - slopes[..., None, None] * dist[:, None, None]
                if vis is not None:
                    vis = vis[:, None, None]
                    t = np.where(vis, t, -np.inf)
                m_new = np.maximum(m, t.max(axis=-1))
                m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
                alpha = np.exp(m - m_safe)
                p = np.exp(t - m_safe[..., None])
                if vis is not None:
                    p = np.where(vis, p, 0.0)
                l = alpha * l + p.sum(axis=-1)
                acc = alpha[..., None] * acc + _values(p, vb, vis)
                m = m_new
            if sink is not None:  # one more term of the denominator, carrying no value (ATTN-SINK-1)
                m_new = np.maximum(m, sink)
                alpha = np.exp(m - m_new)
                l = alpha * l + np.exp(sink - m_new)
                acc = alpha[..., None] * acc
                m = m_new
            ok = l > 0
            out[:, :, :, i0:i1] = np.where(ok[..., None], acc / np.where(ok, l, 1.0)[..., None], 0.0)
            lse[:, :, :, i0:i1] = np.where(ok, m + np.log(np.where(ok, l, 1.0)), -np.inf)
    return out.reshape(B, Hq, Lq, Dv), lse.reshape(B, Hq, Lq)


def tiled_case(case, **blocks) -> tuple[np.ndarray, np.ndarray]:
    """`tiled_forward` of a Case (no boolean mask or bias: those are dense by nature)."""
    if case.mask is not None or case.bias is not None:
        raise ValueError("the tiled reference takes no boolean mask or bias array; use reference.oracle")
    if case.chunk is not None:
        raise ValueError("the tiled reference has no chunked local attention; use reference.oracle")
    return tiled_forward(case.q, case.k, case.v, causal=case.causal, scale=case.scale, q_lengths=case.q_lengths,
                         kv_lengths=case.kv_lengths, window=case.window, window_align=case.window_align,
                         softcap=case.softcap, alibi_slopes=case.alibi_slopes, sinks=case.sinks, **blocks)


def _values(p: np.ndarray, vb: np.ndarray, vis: np.ndarray | None) -> np.ndarray:
    """p @ V where invisible V rows contribute nothing, even when they hold NaN or inf."""
    bad = ~np.isfinite(vb)
    if not bad.any():
        return np.matmul(p, vb)
    res = np.matmul(p, np.where(bad, 0.0, vb))
    seen = np.ones(p.shape, bool) if vis is None else np.broadcast_to(vis, p.shape)
    hit = np.matmul(seen.astype(np.float64), bad.any(axis=-1, keepdims=True).astype(np.float64))[..., 0] > 0
    vfull = np.broadcast_to(vb, p.shape[:-2] + vb.shape[-2:])
    for idx in zip(*np.nonzero(hit)):
        cols = seen[idx]
        res[idx] = (p[idx][cols, None] * vfull[idx[:-1]][cols]).sum(axis=0)
    return res


def rows_case(case, rows) -> "object":
    """The Case of some query rows of `case` against all of its keys, its visibility an explicit mask.

    A row's output, lse and naive emulation depend on that row's query and the keys it sees only, so
    `oracle` and `baseline_error` of this case are the reference and the yardstick of ATTN-TOL-1 on those
    rows, in O(rows x Lk) memory where the whole case needs O(Lq x Lk) (ATTN-LONG-1 at L = 32769). Takes
    causal masks, lengths, scale, softcap and sinks; a mask, bias, window, ALiBi or dropout is refused
    (ALiBi and windows depend on the row's position, which the smaller case does not keep).
    """
    from .case import Case

    for name in ("mask", "bias", "window", "alibi_slopes"):
        if getattr(case, name) is not None:
            raise ValueError(f"rows_case takes no {name}; use the whole case's oracle")
    if case.dropout_p:
        raise ValueError("rows_case takes no dropout")
    rows = np.asarray(rows, dtype=np.int64)
    B, _, Lq, _ = case.q.shape
    Lk = case.k.shape[2]
    q_lens = np.full(B, Lq) if case.q_lengths is None else case.q_lengths
    kv_lens = np.full(B, Lk) if case.kv_lengths is None else case.kv_lengths
    i = rows[None, :, None]
    j = np.arange(Lk)[None, None, :]
    ql, kl = q_lens[:, None, None], kv_lens[:, None, None]
    vis = (i < ql) & (j < kl)
    if case.causal == "top_left":
        vis &= j <= i
    elif case.causal == "bottom_right":
        vis &= j <= i + (kl - ql)
    return Case.build(case.q[:, :, rows], case.k, case.v, dtype=case.dtype, mask=vis[:, None], scale=case.scale,
                      softcap=case.softcap, sinks=case.sinks, seed=case.seed)
