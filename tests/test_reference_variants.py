"""The reference for windows, softcap, ALiBi and sinks, verified independently (ATTN-WIN/CAP/ALIBI/SINK-*).

Three kinds of evidence, none sharing code with reference/:

- a 50-digit mpmath evaluation written straight from the clause statements of SPEC sections 18 to
  21 with plain loops (visibility, alignment per batch element, the cap, the ALiBi distance, the
  sink's extra term are re-derived here);
- closed forms and hand-checked examples (a window that leaves one key, a cap far above the
  logits, slope 0, a sink of -inf, a dominant sink, worked numbers);
- the equivalences the spec states (a window is its mask, (-1, 0) is causal, ALiBi is its bias).
"""
from __future__ import annotations

import math
import zlib

import mpmath
import numpy as np
import pytest

from attnconf.reference import Case, forward, oracle
from attnconf.spec.vocabulary import ALIGNMENTS

mpmath.mp.dps = 50


def mp_variants(q, k, v, *, mask=None, bias=None, causal=None, scale=None, q_lengths=None, kv_lengths=None,
                window=None, window_align="bottom_right", softcap=None, alibi_slopes=None, sinks=None):
    """(out, lse) as float64, at 50 digits, from ATTN-OP-1, ATTN-WIN-1/2, ATTN-CAP-1, ATTN-ALIBI-1, ATTN-SINK-1/2."""
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    full = (B, Hq, Lq, Lk)
    m = None if mask is None else np.broadcast_to(mask, full)
    bb = None if bias is None else np.broadcast_to(bias, full)
    s = mpmath.mpf(1) / mpmath.sqrt(Dk) if scale is None else mpmath.mpf(scale)
    out = np.zeros((B, Hq, Lq, Dv))
    lse = np.full((B, Hq, Lq), -np.inf)
    for b in range(B):
        ql = Lq if q_lengths is None else int(q_lengths[b])
        kl = Lk if kv_lengths is None else int(kv_lengths[b])
        off = 0 if window_align == "top_left" else kl - ql          # ATTN-WIN-2, per batch element
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            if alibi_slopes is None:
                slope = None
            elif np.ndim(alibi_slopes) == 1:
                slope = mpmath.mpf(alibi_slopes[h])
            else:
                slope = mpmath.mpf(alibi_slopes[b][h])
            for i in range(Lq):
                logits = {}
                for j in range(Lk):
                    if i >= ql or j >= kl:
                        continue
                    if causal == "top_left" and j > i:
                        continue
                    if causal == "bottom_right" and j > i + (kl - ql):
                        continue
                    if window is not None:
                        left, right = window
                        if left != -1 and j < i + off - left:
                            continue
                        if right != -1 and j > i + off + right:
                            continue
                    if m is not None and not m[b, h, i, j]:
                        continue
                    if bb is not None and bb[b, h, i, j] == -np.inf:
                        continue
                    x = s * mpmath.fsum(mpmath.mpf(q[b, h, i, d]) * mpmath.mpf(k[b, hk, j, d]) for d in range(Dk))
                    if softcap is not None:
                        c = mpmath.mpf(softcap)
                        x = c * mpmath.tanh(x / c)
                    if slope is not None:
                        x = x - slope * abs(i + off - j)
                    if bb is not None:
                        x = x + mpmath.mpf(bb[b, h, i, j])
                    logits[j] = x
                terms = [mpmath.exp(x) for x in logits.values()]
                if sinks is not None:
                    terms.append(mpmath.exp(mpmath.mpf(sinks[h])))
                if not terms:
                    continue
                z = mpmath.fsum(terms)
                lse[b, h, i] = float(mpmath.log(z))
                for d in range(Dv):
                    out[b, h, i, d] = float(mpmath.fsum(mpmath.exp(x) / z * mpmath.mpf(v[b, hk, j, d])
                                                        for j, x in logits.items()))
    return out, lse


def _case(seed, B=2, Hq=2, Hkv=None, Lq=5, Lk=7, Dk=3, Dv=4, dtype="float64", **params) -> Case:
    rng = np.random.default_rng(seed)
    Hkv = Hq if Hkv is None else Hkv
    q = rng.standard_normal((B, Hq, Lq, Dk))
    k = rng.standard_normal((B, Hkv, Lk, Dk))
    v = rng.standard_normal((B, Hkv, Lk, Dv))
    return Case.build(q, k, v, dtype=dtype, **params)


def _slopes(seed, shape):
    return np.random.default_rng(seed).uniform(0.05, 1.0, shape)


CASES = {
    "window_br_two_sided": dict(window=(2, 1)),
    "window_tl_two_sided": dict(window=(1, 2), window_align="top_left"),
    "window_br_left_only": dict(window=(3, -1)),
    "window_br_right_only_lq_gt_lk": dict(window=(-1, 1), Lq=9, Lk=4),       # top rows emptied
    "window_tl_right_beyond_lk": dict(window=(0, 0), window_align="top_left", Lq=9, Lk=4),
    "window_zero_zero": dict(window=(0, 0)),
    "window_causal_tl_window_br": dict(window=(2, 3), causal="top_left", Lq=6, Lk=9),
    "window_causal_br_padded": dict(window=(1, -1), causal="bottom_right", q_lengths=[5, 3], kv_lengths=[7, 4]),
    "window_padding_zero_kv": dict(window=(2, 2), kv_lengths=[0, 6]),
    "window_gqa": dict(window=(2, 0), Hq=4, Hkv=2),
    "softcap_small": dict(softcap=0.7),
    "softcap_large_logits": dict(softcap=5.0, scale=9.0),
    "softcap_bias_neginf": dict(softcap=1.5, bias=np.where(np.arange(7) % 3 == 0, -np.inf, 0.4)),
    "alibi_heads_br": dict(alibi_slopes=_slopes(1, (2,))),
    "alibi_batch_heads_tl": dict(alibi_slopes=_slopes(2, (2, 2)), window_align="top_left"),
    "alibi_causal_br_lq_lt_lk": dict(alibi_slopes=_slopes(3, (2,)), causal="bottom_right", Lq=4, Lk=9),
    "alibi_padded_br": dict(alibi_slopes=_slopes(4, (2, 2)), q_lengths=[4, 5], kv_lengths=[7, 3]),
    "alibi_negative_slope": dict(alibi_slopes=np.array([-0.3, 0.2])),
    "sinks": dict(sinks=np.array([0.3, -1.2])),
    "sinks_dominant": dict(sinks=np.array([8.0, 12.0])),
    "sinks_with_empty_rows": dict(sinks=np.array([0.5, -0.5]), causal="bottom_right", Lq=9, Lk=4),
    "sinks_gqa_mask": dict(sinks=np.array([0.1, 1.0, -2.0, 3.0]), Hq=4, Hkv=1,
                           mask=np.random.default_rng(5).random((2, 1, 5, 7)) < 0.5),
    "everything": dict(window=(3, 1), softcap=2.0, alibi_slopes=_slopes(6, (2, 4)), sinks=np.array([0.2, 1.0, -1.0, 2.0]),
                       Hq=4, Hkv=2, causal="bottom_right", bias=np.random.default_rng(7).standard_normal((5, 7)),
                       q_lengths=[5, 4], kv_lengths=[6, 7]),
    "everything_top_left": dict(window=(1, 2), window_align="top_left", softcap=1.0, alibi_slopes=_slopes(8, (2,)),
                                sinks=np.array([-0.4, 0.9]), causal="top_left", Lq=8, Lk=5),
}


@pytest.mark.clauses("ATTN-WIN-1", "ATTN-WIN-2", "ATTN-WIN-3", "ATTN-CAP-1", "ATTN-ALIBI-1", "ATTN-SINK-1",
                     "ATTN-SINK-2", "ATTN-SINK-3", "ATTN-LSE-1", "ATTN-LSE-2")
@pytest.mark.parametrize("name", sorted(CASES))
def test_oracle_matches_mpmath_on_variants(name):
    case = _case(zlib.crc32(name.encode()) % 1000, **CASES[name])
    ref = oracle(case)
    out, lse = mp_variants(case.q, case.k, case.v, mask=case.mask, bias=case.bias, causal=case.causal,
                           scale=case.scale, q_lengths=case.q_lengths, kv_lengths=case.kv_lengths,
                           window=case.window, window_align=case.window_align, softcap=case.softcap,
                           alibi_slopes=case.alibi_slopes, sinks=case.sinks)
    assert np.abs(ref.out - out).max() <= 1e-12 * np.abs(case.v).max()
    empty = np.isneginf(lse)
    assert np.array_equal(np.isneginf(ref.lse), empty)
    assert np.all(np.abs(ref.lse[~empty] - lse[~empty]) <= 1e-12 * np.maximum(1.0, np.abs(lse[~empty])))
    no_key = ~ref.visible.any(axis=-1)
    assert np.all(ref.out[no_key] == 0.0)
    if case.sinks is not None:  # ATTN-SINK-3: an empty row's lse is the sink
        assert np.array_equal(ref.lse[no_key], np.broadcast_to(case.sinks[None, :, None], no_key.shape)[no_key])


@pytest.mark.clauses("ATTN-WIN-3", "ATTN-CAUSAL-3")
def test_mpmath_cases_reach_the_corners():
    """The table above really exercises empty rows from windows and padding, and sinks on them."""
    for name in ("window_br_right_only_lq_gt_lk", "window_tl_right_beyond_lk", "sinks_with_empty_rows"):
        case = _case(zlib.crc32(name.encode()) % 1000, **CASES[name])
        assert (~oracle(case).visible.any(axis=-1)).any(), name


# ---- closed forms and hand examples ---------------------------------------------------------

def _qkv(seed, B=1, Hq=1, Hkv=1, Lq=4, Lk=6, Dk=3, Dv=2):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, Hq, Lq, Dk)), rng.standard_normal((B, Hkv, Lk, Dk)), rng.standard_normal((B, Hkv, Lk, Dv))


@pytest.mark.clauses("ATTN-WIN-1", "ATTN-WIN-2")
@pytest.mark.parametrize("align,lq,lk", [("bottom_right", 4, 6), ("top_left", 4, 6), ("bottom_right", 6, 4),
                                         ("top_left", 6, 4)])
def test_window_zero_zero_leaves_exactly_the_diagonal_key(align, lq, lk):
    """Window (0, 0): row i sees only key i + off, so its output is that value row (or 0 if out of range)."""
    q, k, v = _qkv(1, Lq=lq, Lk=lk)
    f = forward(q, k, v, window=(0, 0), window_align=align)
    off = 0 if align == "top_left" else lk - lq
    for i in range(lq):
        j = i + off
        if 0 <= j < lk:
            np.testing.assert_allclose(f.out[0, 0, i], v[0, 0, j], rtol=0, atol=1e-15)
            assert f.lse[0, 0, i] == pytest.approx(q[0, 0, i] @ k[0, 0, j] / np.sqrt(3), abs=1e-14)
        else:
            assert np.all(f.out[0, 0, i] == 0) and np.isneginf(f.lse[0, 0, i])


@pytest.mark.clauses("ATTN-WIN-1")
def test_window_bounds_are_inclusive_by_hand():
    """Lq = 1, Lk = 10, bottom-right (off = 9), window (3, 0): keys 6, 7, 8, 9 exactly; with Q = 0 the
    weights are 1/4 each and the key one past each bound has weight 0."""
    q = np.zeros((1, 1, 1, 2))
    k = np.random.default_rng(2).standard_normal((1, 1, 10, 2))
    v = np.eye(10)[None, None]
    f = forward(q, k, v, window=(3, 0))
    np.testing.assert_array_equal(f.visible[0, 0, 0], np.arange(10) >= 6)
    np.testing.assert_allclose(f.out[0, 0, 0], np.where(np.arange(10) >= 6, 0.25, 0.0), atol=1e-16)
    assert f.lse[0, 0, 0] == pytest.approx(math.log(4), abs=1e-15)
    g = forward(q, k, v, window=(2, 1), window_align="top_left")     # i = 0: keys 0, 1 (left bound clipped)
    np.testing.assert_array_equal(g.visible[0, 0, 0], np.arange(10) <= 1)


@pytest.mark.clauses("ATTN-WIN-4", "ATTN-CAUSAL-1")
@pytest.mark.parametrize("align", ALIGNMENTS)
@pytest.mark.parametrize("lq,lk", [(5, 8), (8, 5), (6, 6)])
def test_window_minus_one_zero_is_causal_and_minus_one_minus_one_is_nothing(align, lq, lk):
    q, k, v = _qkv(3, B=2, Hq=2, Hkv=2, Lq=lq, Lk=lk)
    for lens in (None, {"q_lengths": [lq, lq - 2], "kv_lengths": [lk - 1, lk]}):
        extra = lens or {}
        w = forward(q, k, v, window=(-1, 0), window_align=align, **extra)
        c = forward(q, k, v, causal=align, **extra)
        np.testing.assert_array_equal(w.visible, c.visible)
        np.testing.assert_array_equal(w.out, c.out)
        n = forward(q, k, v, window=(-1, -1), window_align=align, **extra)
        p = forward(q, k, v, **extra)
        np.testing.assert_array_equal(n.out, p.out)


@pytest.mark.clauses("ATTN-WIN-3", "ATTN-MASK-2")
def test_window_equals_its_boolean_mask_written_by_hand():
    q, k, v = _qkv(4, B=2, Hq=2, Hkv=1, Lq=7, Lk=5)
    lengths = {"q_lengths": np.array([7, 4]), "kv_lengths": np.array([5, 3])}
    mask = np.zeros((2, 1, 7, 5), dtype=bool)
    for b in range(2):
        off = int(lengths["kv_lengths"][b] - lengths["q_lengths"][b])
        for i in range(7):
            for j in range(5):
                mask[b, 0, i, j] = i + off - 2 <= j <= i + off + 1
    w = forward(q, k, v, window=(2, 1), **lengths)
    m = forward(q, k, v, mask=mask, **lengths)
    np.testing.assert_array_equal(w.visible, m.visible)
    np.testing.assert_allclose(w.out, m.out, rtol=0, atol=0)
    np.testing.assert_array_equal(w.lse, m.lse)


@pytest.mark.clauses("ATTN-CAP-1")
def test_softcap_two_keys_by_hand():
    """One query, two keys, scale 1: logits x = (3, -1), c = 2: P0 = sigmoid(2 tanh(1.5) - 2 tanh(-0.5))."""
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[3.0, 0.0], [-1.0, 0.0]]]])
    v = np.array([[[[1.0], [0.0]]]])
    f = forward(q, k, v, scale=1.0, softcap=2.0)
    a, b = 2 * math.tanh(1.5), 2 * math.tanh(-0.5)
    assert f.out[0, 0, 0, 0] == pytest.approx(1 / (1 + math.exp(b - a)), abs=1e-15)
    assert f.lse[0, 0, 0] == pytest.approx(math.log(math.exp(a) + math.exp(b)), abs=1e-14)


@pytest.mark.clauses("ATTN-CAP-2")
def test_softcap_tends_to_no_cap_and_bounds_the_weights():
    q, k, v = _qkv(5, Hq=2, Hkv=2, Lq=6, Lk=9)
    plain = forward(q, k, v)
    # c tanh(x/c) = x - x^3 / (3 c^2) + ...: with |x| < 5 and c = 1e6 the logits move by < 5e-11
    far = forward(q, k, v, softcap=1e6)
    assert np.abs(far.out - plain.out).max() < 1e-10
    # huge logits (|x| ~ 1e5) with c = 1.5: finite, every weight in [exp(-2c)/n, exp(2c)/n]
    big = forward(q * 300, k * 300, v, softcap=1.5)
    assert np.isfinite(big.out).all() and np.isfinite(big.lse).all()
    n = 9
    assert big.weights.min() >= math.exp(-3.0) / n * (1 - 1e-12)
    assert big.weights.max() <= math.exp(3.0) / n * (1 + 1e-12)
    assert np.abs(big.lse).max() < 1.5 + math.log(n) + 1e-12


@pytest.mark.clauses("ATTN-CAP-1", "ATTN-MASK-3")
def test_softcap_never_unmasks():
    """cap(-inf) would be -c: the cap applies before the mask, so -inf bias positions keep weight 0."""
    q, k, v = _qkv(6, Lq=3, Lk=5)
    bias = np.array([0.0, -np.inf, 0.0, -np.inf, 0.0])
    f = forward(q, k, v, bias=bias, softcap=0.5)
    assert np.all(f.weights[..., [1, 3]] == 0.0)


@pytest.mark.clauses("ATTN-ALIBI-1")
def test_alibi_by_hand():
    """Q = 0, Lq = 1, Lk = 3, bottom-right (off = 2), slope ln 2: biases -2 ln2, -ln2, 0, weights 1/7, 2/7, 4/7."""
    q = np.zeros((1, 1, 1, 2))
    k = np.random.default_rng(7).standard_normal((1, 1, 3, 2))
    v = np.eye(3)[None, None]
    f = forward(q, k, v, alibi_slopes=np.array([math.log(2)]))
    np.testing.assert_allclose(f.out[0, 0, 0], [1 / 7, 2 / 7, 4 / 7], atol=1e-15)
    assert f.lse[0, 0, 0] == pytest.approx(math.log(7 / 4), abs=1e-15)
    # top-left: off = 0, distances 0, 1, 2: weights 4/7, 2/7, 1/7
    g = forward(q, k, v, alibi_slopes=np.array([math.log(2)]), window_align="top_left")
    np.testing.assert_allclose(g.out[0, 0, 0], [4 / 7, 2 / 7, 1 / 7], atol=1e-15)
    # non-causal, Lq = Lk = 3: |i - j| is symmetric, row 1 has distances 1, 0, 1
    q3 = np.zeros((1, 1, 3, 2))
    h = forward(q3, np.zeros((1, 1, 3, 2)), v, alibi_slopes=np.array([math.log(2)]))
    np.testing.assert_allclose(h.out[0, 0, 1], [1 / 4, 1 / 2, 1 / 4], atol=1e-15)


@pytest.mark.clauses("ATTN-ALIBI-2", "ATTN-ALIBI-1")
@pytest.mark.parametrize("align", ALIGNMENTS)
def test_alibi_is_its_explicit_bias_and_slope_zero_is_nothing(align):
    q, k, v = _qkv(8, B=2, Hq=3, Hkv=1, Lq=5, Lk=8)
    slopes = _slopes(9, (2, 3))
    lens = {"q_lengths": np.array([5, 2]), "kv_lengths": np.array([8, 6])}
    bias = np.zeros((2, 3, 5, 8))
    for b in range(2):
        off = 0 if align == "top_left" else int(lens["kv_lengths"][b] - lens["q_lengths"][b])
        for h in range(3):
            for i in range(5):
                for j in range(8):
                    bias[b, h, i, j] = -slopes[b, h] * abs(i + off - j)
    extra = bias[:, :, :, ::-1].copy()   # any explicit bias: ALiBi adds to it
    a = forward(q, k, v, alibi_slopes=slopes, window_align=align, softcap=1.3, bias=extra, **lens)
    e = forward(q, k, v, bias=bias + extra, softcap=1.3, **lens)
    np.testing.assert_allclose(a.out, e.out, rtol=0, atol=1e-15)
    fin = np.isfinite(e.lse)
    np.testing.assert_allclose(a.lse[fin], e.lse[fin], rtol=1e-15, atol=1e-15)
    z = forward(q, k, v, alibi_slopes=np.zeros(3), window_align=align, **lens)
    np.testing.assert_array_equal(z.out, forward(q, k, v, **lens).out)


@pytest.mark.clauses("ATTN-SINK-1", "ATTN-SINK-2", "ATTN-SINK-3")
def test_sink_by_hand():
    """One key with logit 0 and a sink 0: P = 1/2, out = V/2, lse = ln 2; with no key, out 0 and lse = sink."""
    q = np.zeros((1, 1, 2, 2))
    k = np.ones((1, 1, 1, 2))
    v = np.array([[[[4.0, -2.0]]]])
    f = forward(q, k, v, sinks=np.array([0.0]), q_lengths=np.array([1]))
    np.testing.assert_allclose(f.out[0, 0, 0], [2.0, -1.0], atol=1e-15)
    assert f.lse[0, 0, 0] == pytest.approx(math.log(2), abs=1e-15)
    assert np.all(f.out[0, 0, 1] == 0) and f.lse[0, 0, 1] == 0.0
    g = forward(q, k, v, sinks=np.array([-3.5]), kv_lengths=np.array([0]))
    assert np.all(g.out == 0) and np.all(g.lse == -3.5) and np.all(g.weights == 0)


@pytest.mark.clauses("ATTN-SINK-2")
def test_sink_scales_rows_and_minus_inf_is_no_sink():
    q, k, v = _qkv(10, B=2, Hq=2, Hkv=2, Lq=5, Lk=6)
    base = forward(q, k, v, causal="bottom_right", window=(2, -1))
    none = forward(q, k, v, causal="bottom_right", window=(2, -1), sinks=np.array([-np.inf, -np.inf]))
    np.testing.assert_array_equal(none.out, base.out)
    np.testing.assert_array_equal(none.lse, base.lse)
    for sink in (np.array([-2.0, 0.5]), np.array([20.0, 40.0])):          # small, and dominant
        f = forward(q, k, v, causal="bottom_right", window=(2, -1), sinks=sink)
        factor = 1.0 / (1.0 + np.exp(sink[None, :, None] - base.lse))
        np.testing.assert_allclose(f.out, base.out * factor[..., None], rtol=1e-13, atol=1e-300)
        np.testing.assert_allclose(f.lse, np.logaddexp(base.lse, sink[None, :, None]), rtol=1e-15)
        np.testing.assert_allclose(f.weights.sum(-1), factor, rtol=1e-13, atol=0)   # rows sum to 1 - P_sink
    dominant = forward(q, k, v, causal="bottom_right", window=(2, -1), sinks=np.array([20.0, 40.0]))
    # a sink 20 above logits of order 1 scales outputs by about exp(lse0 - 20): tiny but exactly predicted
    assert np.abs(dominant.out).max() < 1e-6 * np.abs(base.out).max()


# ---- the case file keeps the alignment of an ALiBi case -------------------------------------

@pytest.mark.clauses("ATTN-ALIBI-1", "ATTN-WIN-2")
def test_alibi_alignment_survives_save_and_load(tmp_path):
    case = _case(11, alibi_slopes=_slopes(12, (2,)), window_align="top_left", softcap=2.0, sinks=np.array([0.1, 0.2]))
    back = Case.load(case.save(tmp_path / "c.npz"))
    assert back.window_align == "top_left" and back.softcap == 2.0
    np.testing.assert_array_equal(oracle(back).out, oracle(case).out)
    assert back.digest() == case.digest()
    assert case.digest() != case.replace(window_align="bottom_right").digest()
