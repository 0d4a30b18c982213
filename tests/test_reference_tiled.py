"""The tiled float64 forward against the dense oracle, its memory growth, and one L = 32768 run."""
from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from attnconf.reference import forward, tiled_forward
from attnconf.spec.vocabulary import ALIGNMENTS


def _qkv(seed, B, Hq, Hkv, Lq, Lk, Dk, Dv):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, Lq, Dk)), rng.standard_normal((B, Hkv, Lk, Dk)),
            rng.standard_normal((B, Hkv, Lk, Dv)))


def _assert_same(tiled, dense, vmax):
    out, lse = tiled
    assert np.abs(out - dense.out).max() <= 1e-12 * vmax
    empty = np.isneginf(dense.lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.all(out[empty] == 0.0)
    assert np.all(np.abs(lse[~empty] - dense.lse[~empty]) <= 1e-12 * np.maximum(1.0, np.abs(dense.lse[~empty])))


SHAPES = [  # B, Hq, Hkv, Lq, Lk, Dk, Dv, block_q, block_k
    (1, 1, 1, 1, 1, 4, 4, 256, 512),
    (2, 2, 2, 37, 53, 8, 5, 16, 8),      # partial last blocks in both directions
    (1, 3, 3, 64, 64, 16, 16, 16, 16),   # exact multiples
    (2, 4, 2, 30, 17, 8, 8, 7, 5),       # GQA, Lq > Lk
    (1, 4, 1, 9, 70, 4, 6, 4, 32),       # MQA, Lq < Lk
    (1, 2, 2, 300, 700, 8, 8, 256, 512),  # the default blocks, partial
    (1, 1, 1, 5, 0, 4, 4, 2, 2),         # no keys at all
]


@pytest.mark.clauses("ATTN-LONG-1", "ATTN-CAUSAL-1", "ATTN-CAUSAL-3", "ATTN-MASK-4", "ATTN-GQA-1",
                     "ATTN-GQA-2", "ATTN-EMPTY-1", "ATTN-EMPTY-2", "ATTN-W-3")
@pytest.mark.parametrize("causal", (None, *ALIGNMENTS))
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tiled_matches_dense(shape, causal, padded):
    B, Hq, Hkv, Lq, Lk, Dk, Dv, bq, bk = shape
    q, k, v = _qkv(sum(shape), B, Hq, Hkv, Lq, Lk, Dk, Dv)
    params = {"causal": causal}
    if padded:
        rng = np.random.default_rng(Lq * Lk)
        params["q_lengths"] = rng.integers(0, Lq + 1, B)
        params["kv_lengths"] = rng.integers(0, Lk + 1, B)
        params["q_lengths"][0], params["kv_lengths"][0] = Lq, max(Lk - 1, 0)
    dense = forward(q, k, v, **params)
    tiled = tiled_forward(q, k, v, block_q=bq, block_k=bk, **params)
    _assert_same(tiled, dense, max(1.0, np.abs(v).max()) if v.size else 1.0)


@pytest.mark.clauses("ATTN-OP-4", "ATTN-PROP-13")
def test_tiled_with_scale_and_large_logits_rescales_correctly():
    """Later key blocks holding ever larger logits force the running maximum to move."""
    q, k, v = _qkv(5, 1, 2, 2, 40, 90, 8, 8)
    k = k * np.linspace(1, 30, 90)[None, None, :, None]  # logits up to ~1e2 * scale
    for scale in (None, 0.05, 3.0):
        dense = forward(q, k, v, scale=scale, causal="bottom_right")
        _assert_same(tiled_forward(q, k, v, scale=scale, causal="bottom_right", block_q=16, block_k=8),
                     dense, np.abs(v).max())


@pytest.mark.clauses("ATTN-MASK-3")
def test_tiled_ignores_poison_beyond_padding():
    q, k, v = _qkv(6, 2, 2, 1, 12, 20, 4, 4)
    lens = np.array([13, 20])
    clean = tiled_forward(q, k, v, kv_lengths=lens, block_q=5, block_k=6)
    k[0, :, 13:], v[0, :, 13:] = np.nan, np.inf
    dirty = tiled_forward(q, k, v, kv_lengths=lens, block_q=5, block_k=6)
    np.testing.assert_array_equal(dirty[0], clean[0])
    np.testing.assert_array_equal(dirty[1], clean[1])


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.clauses("ATTN-PROP-7")
def test_memory_grows_quadratically_dense_and_linearly_tiled():
    lengths = np.array([256, 512, 1024])
    dense, tiled = [], []
    for L in lengths:
        q, k, v = _qkv(int(L), 1, 1, 1, int(L), int(L), 64, 64)
        dense.append(_peak_bytes(lambda: forward(q, k, v)))
        tiled.append(_peak_bytes(lambda: tiled_forward(q, k, v, block_q=32, block_k=32)))
    slope = lambda peaks: np.polyfit(np.log(lengths), np.log(peaks), 1)[0]
    assert slope(dense) > 1.6, dense
    assert slope(tiled) < 1.4, tiled
    assert tiled[-1] < dense[-1] / 10


def _rowwise_dense(q, k, v, rows, causal):
    """Output rows of the dense definition, one query row at a time (O(L) memory per row)."""
    lk, scale = k.shape[0], 1.0 / np.sqrt(q.shape[1])
    out, lse = [], []
    for i in rows:
        visible = i + 1 if causal == "top_left" else lk
        s = scale * (k[:visible] @ q[i])
        m = s.max()
        p = np.exp(s - m)
        out.append(p @ v[:visible] / p.sum())
        lse.append(m + np.log(p.sum()))
    return np.array(out), np.array(lse)


@pytest.mark.slow
@pytest.mark.clauses("ATTN-LONG-1", "ATTN-PROP-7")
def test_tiled_at_32768_matches_sampled_dense_rows():
    """L = 32768, B = H = 1, D = 64, causal: about 10 s alone on 2 cores, far more under load."""
    L, D = 32768, 64
    q, k, v = _qkv(32768, 1, 1, 1, L, L, D, D)
    tracemalloc.start()
    t0 = time.perf_counter()
    out, lse = tiled_forward(q, k, v, causal="top_left")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows = np.unique(np.r_[0, 1, 255, 256, 511, 512, 16383, 16384, L - 1,
                           np.random.default_rng(0).integers(0, L, 24)])
    ref_out, ref_lse = _rowwise_dense(q[0, 0], k[0, 0], v[0, 0], rows, "top_left")
    assert np.abs(out[0, 0, rows] - ref_out).max() <= 1e-12 * np.abs(v).max()
    assert np.abs(lse[0, 0, rows] - ref_lse).max() <= 1e-12 * np.abs(ref_lse).max()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB in {seconds:.1f} s"  # dense would need 8 GiB per array
