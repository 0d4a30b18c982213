"""The tiled float64 forward with windows, softcap, ALiBi and sinks, and decode (ATTN-LONG-1, ATTN-DECODE-1).

Tiled equals dense to 1e-12 on partial blocks, padding, GQA and empty rows; decode (Lq = 1) is
checked against the dense oracle up to Lk = 32768 (cheap at Lq = 1); one slow run at L = 32768 with
a window and every variant is checked row by row against a plain-loop evaluation of the clauses.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attnconf.reference import Case, forward, oracle, tiled_case, tiled_forward


def _qkv(seed, B, Hq, Hkv, Lq, Lk, Dk, Dv):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, Lq, Dk)), rng.standard_normal((B, Hkv, Lk, Dk)),
            rng.standard_normal((B, Hkv, Lk, Dv)))


def _assert_same(tiled, dense, vmax):
    out, lse = tiled
    assert np.abs(out - dense.out).max(initial=0) <= 1e-12 * vmax
    empty = np.isneginf(dense.lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[~dense.visible.any(axis=-1)] == 0.0)
    assert np.all(np.abs(lse[~empty] - dense.lse[~empty]) <= 1e-12 * np.maximum(1.0, np.abs(dense.lse[~empty])))


VARIANTS = {
    "window_br": dict(window=(5, 2)),
    "window_tl": dict(window=(3, 0), window_align="top_left"),
    "window_left_only_causal": dict(window=(4, -1), causal="bottom_right"),
    "window_right_only": dict(window=(-1, 3), window_align="top_left", causal="top_left"),
    "softcap": dict(softcap=1.3),
    "alibi": dict(alibi_slopes="heads"),
    "alibi_batch_tl": dict(alibi_slopes="batch", window_align="top_left"),
    "sinks": dict(sinks=True),
    "everything": dict(window=(6, 1), softcap=2.5, alibi_slopes="batch", sinks=True, causal="bottom_right"),
}
SHAPES = [  # B, Hq, Hkv, Lq, Lk, Dk, Dv, block_q, block_k
    (2, 2, 2, 37, 53, 8, 5, 16, 8),
    (2, 4, 2, 30, 17, 8, 8, 7, 5),       # Lq > Lk: bottom-right windows empty top rows
    (1, 4, 1, 9, 70, 4, 6, 4, 32),
    (1, 2, 2, 300, 700, 8, 8, 256, 512),
]


def _params(name, B, Hq, rng):
    p = dict(VARIANTS[name])
    if p.get("alibi_slopes") == "heads":
        p["alibi_slopes"] = rng.uniform(0, 0.5, Hq)
    elif p.get("alibi_slopes") == "batch":
        p["alibi_slopes"] = rng.uniform(0, 0.5, (B, Hq))
    if p.get("sinks"):
        p["sinks"] = rng.normal(size=Hq) * 2
    return p


@pytest.mark.clauses("ATTN-LONG-1", "ATTN-WIN-1", "ATTN-WIN-2", "ATTN-CAP-1", "ATTN-ALIBI-1", "ATTN-SINK-1",
                     "ATTN-SINK-3")
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_tiled_variants_match_dense(name, shape, padded):
    B, Hq, Hkv, Lq, Lk, Dk, Dv, bq, bk = shape
    q, k, v = _qkv(sum(shape), B, Hq, Hkv, Lq, Lk, Dk, Dv)
    rng = np.random.default_rng(len(name) * 7 + Lq)
    params = _params(name, B, Hq, rng)
    if padded:
        params["q_lengths"] = rng.integers(0, Lq + 1, B)
        params["kv_lengths"] = rng.integers(0, Lk + 1, B)
        params["q_lengths"][0], params["kv_lengths"][0] = Lq, max(Lk - 1, 0)
    dense = forward(q, k, v, **params)
    _assert_same(tiled_forward(q, k, v, block_q=bq, block_k=bk, **params), dense, np.abs(v).max())


@pytest.mark.clauses("ATTN-LONG-1", "ATTN-WIN-1")
def test_tiled_skips_tiles_outside_the_window():
    """A window (64, 0) over L = 4096 in 128-blocks touches the 32 diagonal tiles and the 31 below them,
    63 of 1024: a windowed pass costs O(L * window), not O(L^2) (counted, not timed)."""
    from attnconf.reference.tiled import _offsets, _tile_empty

    L, blk = 4096, 128
    lens = np.array([L])
    off = _offsets("bottom_right", lens, lens, L, L)
    live = sum(not _tile_empty(i0, i0 + blk, j0, j0 + blk, None, lens, lens, (64, 0), off)
               for i0 in range(0, L, blk) for j0 in range(0, L, blk))
    assert live == 63
    full = sum(not _tile_empty(i0, i0 + blk, j0, j0 + blk, None, lens, lens, None, off)
               for i0 in range(0, L, blk) for j0 in range(0, L, blk))
    assert full == 1024


@pytest.mark.clauses("ATTN-DECODE-1", "ATTN-LONG-1")
@pytest.mark.parametrize("lk", [1, 2, 511, 513, 4097, 32768])
def test_decode_tiled_matches_dense_up_to_32768(lk):
    """Lq = 1 (decode), GQA, per-sequence kv lengths, window, softcap, ALiBi, sinks: tiled == dense."""
    B, Hq, Hkv, D = 2, 4, 2, 32
    q, k, v = _qkv(lk, B, Hq, Hkv, 1, lk, D, D)
    rng = np.random.default_rng(lk)
    params = dict(causal="bottom_right", window=(int(min(lk, 1000)) // 3, -1), softcap=4.0,
                  alibi_slopes=2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq), sinks=rng.normal(size=Hq),
                  kv_lengths=np.array([lk, max(lk // 2, 1)]))
    case = Case.build(q, k, v, **params)
    dense = oracle(case)
    _assert_same(tiled_case(case), dense, np.abs(v).max())
    # bottom-right: the one query sits on the last key; causal hides nothing, the window keeps w + 1 keys
    for b, kl in enumerate(params["kv_lengths"]):
        w = params["window"][0]
        assert dense.visible[b, 0, 0].sum() == min(kl, w + 1)
        assert dense.visible[b, 0, 0, kl - 1]


def _rowwise(q, k, v, rows, window, softcap, slope, sink):
    """Rows of the clauses' definition for Lq = Lk = L, bottom-right = top-left (square), one head."""
    L, D = k.shape
    out, lse = [], []
    for i in rows:
        lo = 0 if window[0] < 0 else max(0, i - window[0])
        hi = L - 1 if window[1] < 0 else min(L - 1, i + window[1])
        j = np.arange(lo, hi + 1)
        x = (k[lo:hi + 1] @ q[i]) / np.sqrt(D)
        x = softcap * np.tanh(x / softcap) - slope * np.abs(i - j)
        m = max(x.max(), sink)
        p = np.exp(x - m)
        z = p.sum() + np.exp(sink - m)
        out.append(p @ v[lo:hi + 1] / z)
        lse.append(m + np.log(z))
    return np.array(out), np.array(lse)


@pytest.mark.slow
@pytest.mark.clauses("ATTN-LONG-1", "ATTN-WIN-1", "ATTN-CAP-1", "ATTN-ALIBI-1", "ATTN-SINK-2", "ATTN-PROP-7")
def test_tiled_at_32768_with_window_and_every_variant():
    """L = 32768, window (1024, 0), softcap, ALiBi, sink: sampled rows against plain loops; O(L w) memory."""
    L, D = 32768, 64
    q, k, v = _qkv(32768, 1, 1, 1, L, L, D, D)
    params = dict(window=(1024, 0), softcap=5.0, alibi_slopes=np.array([1 / 256]), sinks=np.array([0.7]))
    tracemalloc.start()
    out, lse = tiled_forward(q, k, v, **params)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows = np.unique(np.r_[0, 1, 1023, 1024, 1025, 16383, 16384, L - 1, np.random.default_rng(0).integers(0, L, 24)])
    ref_out, ref_lse = _rowwise(q[0, 0], k[0, 0], v[0, 0], rows, (1024, 0), 5.0, 1 / 256, 0.7)
    assert np.abs(out[0, 0, rows] - ref_out).max() <= 1e-12 * np.abs(v).max()
    assert np.abs(lse[0, 0, rows] - ref_lse).max() <= 1e-12 * np.abs(ref_lse).max()
    assert peak < 64 * 2**20
