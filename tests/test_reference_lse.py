"""The log-sum-exp helpers (ATTN-LSE-1..4, ATTN-SINK-2): base-2 conversion and the chunk merge.

The merge is checked against the whole oracle on random splits of the keys (empty chunks and chunks
that leave rows empty included), each chunk being the same case with the other keys masked, and by
hand on a two-chunk example.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from attnconf.reference import Case, add_sink, forward, from_base2, merge_partials, oracle, sink_factor, to_base2
from attnconf.spec.vocabulary import ALIGNMENTS


@pytest.mark.clauses("ATTN-LSE-1")
def test_base2_conversion():
    lse = np.array([0.0, math.log(2), -3.5, -np.inf, 700.0])
    back = from_base2(to_base2(lse))
    np.testing.assert_allclose(back, lse, rtol=1e-15, atol=0)   # -inf round-trips to -inf
    np.testing.assert_allclose(to_base2(np.array([math.log(2)])), [1.0], rtol=1e-15)
    np.testing.assert_allclose(from_base2(np.array([1.0, 3.0])), [math.log(2), 3 * math.log(2)], rtol=1e-15)
    assert np.isneginf(from_base2(np.array([-np.inf]))[0])


@pytest.mark.clauses("ATTN-LSE-4")
def test_merge_by_hand():
    """Two chunks of one key each, logits ln 1 and ln 3: weights 1/4, 3/4, lse ln 4."""
    out, lse = merge_partials([np.array([[2.0]]), np.array([[6.0]])], [np.array([0.0]), np.array([math.log(3)])])
    assert out[0, 0] == pytest.approx(0.25 * 2 + 0.75 * 6, abs=1e-15)
    assert lse[0] == pytest.approx(math.log(4), abs=1e-15)


@pytest.mark.clauses("ATTN-LSE-4", "ATTN-LSE-2", "ATTN-EMPTY-1")
def test_merge_of_empty_chunks():
    """Empty chunks (lse -inf) get weight 0 even if their output holds NaN; all empty gives 0, -inf."""
    o = np.array([[1.0, 2.0], [3.0, 4.0]])
    out, lse = merge_partials([o, np.full_like(o, np.nan)], [np.array([0.5, -np.inf]), np.array([-np.inf, -np.inf])])
    np.testing.assert_array_equal(out, [[1.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(lse, [0.5, -np.inf])
    with pytest.raises(ValueError):
        merge_partials([o], [np.zeros(3)])
    with pytest.raises(ValueError):
        merge_partials([], [])


def _chunk(case: Case, lo: int, hi: int) -> Case:
    """The case restricted to keys [lo, hi): every other key masked, positions unchanged (ATTN-LSE-4)."""
    lk = case.shape["Lk"]
    keep = (np.arange(lk) >= lo) & (np.arange(lk) < hi)
    mask = keep[None, None, None, :] if case.mask is None else np.logical_and(case.mask, keep)
    return case.replace(mask=mask, sinks=None)


@pytest.mark.clauses("ATTN-LSE-4", "ATTN-SINK-2", "ATTN-WIN-3")
@pytest.mark.parametrize("seed", range(8))
def test_merge_of_random_chunks_equals_the_whole(seed):
    rng = np.random.default_rng(seed)
    B, Hq, Hkv, Lq, Lk = 2, 4, 2, 7, int(rng.integers(1, 30))
    q, k, v = rng.normal(size=(B, Hq, Lq, 8)), rng.normal(size=(B, Hkv, Lk, 8)), rng.normal(size=(B, Hkv, Lk, 5))
    params = dict(causal=(None, *ALIGNMENTS)[seed % 3], window=[None, (3, 1), (2, -1)][seed % 3],
                  window_align=ALIGNMENTS[seed % 2], softcap=[None, 2.0][seed % 2],
                  alibi_slopes=rng.uniform(0, 0.5, Hq) if seed % 4 < 2 else None,
                  sinks=rng.normal(size=Hq) if seed % 3 == 1 else None,
                  kv_lengths=rng.integers(0, Lk + 1, B) if seed % 2 else None)
    case = Case.build(q, k, v, **params)
    cuts = np.sort(rng.integers(0, Lk + 1, size=int(rng.integers(1, 5))))
    bounds = np.r_[0, cuts, Lk]                                       # repeated cuts give empty chunks
    parts = [oracle(_chunk(case, int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]
    outs, lses = [p.out for p in parts], [p.lse for p in parts]
    if case.sinks is not None:                                        # a sink is a chunk: out 0, lse = sink
        outs.append(np.zeros_like(parts[0].out))
        lses.append(np.broadcast_to(case.sinks[None, :, None], parts[0].lse.shape))
    out, lse = merge_partials(outs, lses)
    whole = oracle(case)
    assert np.abs(out - whole.out).max() <= 1e-13 * np.abs(v).max()
    assert np.array_equal(np.isneginf(lse), np.isneginf(whole.lse))
    fin = np.isfinite(whole.lse)
    assert np.abs(lse[fin] - whole.lse[fin]).max(initial=0) <= 1e-13 * max(1.0, np.abs(whole.lse[fin]).max(initial=0))


@pytest.mark.clauses("ATTN-SINK-2", "ATTN-SINK-3")
def test_add_sink_and_sink_factor_match_the_oracle():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 3, 6, 4)), rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 5, 4))
    sinks = np.array([-1.0, 0.5, 6.0])
    base = forward(q, k, v, window=(0, 0), window_align="top_left")       # row 5 of top-left (0, 0) is empty
    with_sink = forward(q, k, v, window=(0, 0), window_align="top_left", sinks=sinks)
    out, lse = add_sink(base.out, base.lse, sinks[None, :, None])
    np.testing.assert_allclose(out, with_sink.out, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(lse, with_sink.lse, rtol=1e-15)
    f = sink_factor(base.lse, sinks[None, :, None])
    np.testing.assert_allclose(base.out * f[..., None], with_sink.out, rtol=1e-13, atol=1e-300)
    assert np.all(f[:, :, 5] == 0) and np.all(with_sink.lse[:, :, 5] == sinks[None, :])
