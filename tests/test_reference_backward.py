"""The analytic backward against central finite differences of the oracle (float64, h = 1e-6)."""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.reference import Case, backward, backward_arrays, forward

H = 1e-6


def _loss(q, k, v, dout, params):
    return float((forward(q, k, v, **params).out * dout).sum())


def _numeric(q, k, v, dout, params) -> dict[str, np.ndarray]:
    """Central differences of sum(dout * out) with respect to every input element."""
    arrays = {"q": q, "k": k, "v": v}
    if params.get("bias") is not None:
        arrays["bias"] = params["bias"]
    grads = {}
    for name, arr in arrays.items():
        g = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            if not np.isfinite(arr[idx]):
                continue  # a -inf bias entry has no derivative; the analytic one is 0
            vals = []
            for step in (H, -H):
                moved = arr.copy()
                moved[idx] += step
                a = dict(arrays, **{name: moved})
                p = dict(params, bias=a.pop("bias")) if "bias" in a else params
                vals.append(_loss(a["q"], a["k"], a["v"], dout, p))
            g[idx] = (vals[0] - vals[1]) / (2 * H)
        grads[name] = g
    return grads


def _problem(seed, B=2, Hq=2, Hkv=None, Lq=3, Lk=4, Dk=2, Dv=3):
    rng = np.random.default_rng(seed)
    Hkv = Hq if Hkv is None else Hkv
    return (rng.standard_normal((B, Hq, Lq, Dk)), rng.standard_normal((B, Hkv, Lk, Dk)),
            rng.standard_normal((B, Hkv, Lk, Dv)), rng.standard_normal((B, Hq, Lq, Dv)))


def _empty_row_mask():
    m = np.random.default_rng(9).random((2, 2, 3, 4)) < 0.6
    m[..., 0] = True
    m[0, 1, 2] = False  # fully-masked row
    m[1, 0, 0] = False
    return m


SCENARIOS = {
    "plain": ({}, {}),
    "gqa_4_2": ({"Hq": 4, "Hkv": 2}, {}),
    "gqa_4_1_causal": ({"Hq": 4, "Hkv": 1, "Lq": 4}, {"causal": "top_left"}),
    "causal_bottom_right": ({"Lq": 3, "Lk": 5}, {"causal": "bottom_right"}),
    "causal_bottom_right_empty_rows": ({"Lq": 5, "Lk": 3}, {"causal": "bottom_right"}),
    "bool_mask_with_empty_rows": ({}, {"mask": _empty_row_mask()}),
    "padding": ({}, {"q_lengths": np.array([2, 3]), "kv_lengths": np.array([3, 1])}),
    "bias_full": ({}, {"bias": np.random.default_rng(1).standard_normal((2, 2, 3, 4))}),
    "bias_broadcast": ({"Hq": 4, "Hkv": 2}, {"bias": np.random.default_rng(2).standard_normal((2, 1, 1, 4))}),
    "bias_2d_neginf_and_empty_row": ({}, {"bias": np.array([[0.3, -np.inf, 1.0, -0.5],
                                                             [-np.inf] * 4,
                                                             [1.2, 0.1, -np.inf, 0.0]])}),
    "bias_mask_causal_scale": ({"Lq": 4}, {"bias": np.random.default_rng(4).standard_normal((1, 2, 4, 4)),
                                             "mask": np.random.default_rng(5).random((4, 4)) < 0.7,
                                             "causal": "top_left", "scale": 0.8}),
}


@pytest.mark.clauses("ATTN-GRAD-1", "ATTN-GRAD-2", "ATTN-GQA-1", "ATTN-EMPTY-3")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_backward_matches_finite_differences(name):
    shape, params = SCENARIOS[name]
    q, k, v, dout = _problem(len(name), **shape)
    g = backward_arrays(q, k, v, dout, **params)
    num = _numeric(q, k, v, dout, params)
    for key, analytic in (("q", g.dq), ("k", g.dk), ("v", g.dv), ("bias", g.dbias)):
        if key not in num:
            assert analytic is None
            continue
        assert analytic.shape == num[key].shape
        scale = max(1.0, np.abs(analytic).max())
        assert np.abs(analytic - num[key]).max() <= 1e-7 * scale, key


@pytest.mark.clauses("ATTN-EMPTY-3")
def test_fully_masked_rows_contribute_nothing():
    q, k, v, dout = _problem(21, Lq=4, Lk=5)
    mask = np.ones((2, 2, 4, 5), bool)
    mask[0, 1, 2] = False
    mask[1, 0, 0] = False
    g = backward_arrays(q, k, v, dout, mask=mask)
    assert np.all(g.dq[0, 1, 2] == 0.0) and np.all(g.dq[1, 0, 0] == 0.0)
    # Whatever dO and Q hold on the empty rows, dK and dV do not move.
    dout2, q2 = dout.copy(), q.copy()
    dout2[0, 1, 2] = 1e6
    q2[1, 0, 0] = -1e6
    g2 = backward_arrays(q2, k, v, dout2, mask=mask)
    np.testing.assert_array_equal(g2.dk, g.dk)
    np.testing.assert_array_equal(g2.dv, g.dv)
    # Padded query rows behave the same, and an empty row's dBias is exactly 0.
    bias = np.random.default_rng(3).standard_normal((2, 2, 4, 5))
    g3 = backward_arrays(q, k, v, dout, bias=bias, q_lengths=np.array([4, 2]))
    assert np.all(g3.dq[1, :, 2:] == 0.0) and np.all(g3.dbias[1, :, 2:] == 0.0)


@pytest.mark.clauses("ATTN-MASK-3", "ATTN-EMPTY-3")
@pytest.mark.parametrize("poison", [1e30, np.nan, np.inf])
def test_masked_positions_cannot_leak_into_gradients(poison):
    q, k, v, dout = _problem(22, Lq=3, Lk=6)
    params = {"kv_lengths": np.array([4, 6]), "mask": np.arange(6) != 1}
    clean = backward_arrays(q, k, v, dout, **params)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 4:] = poison
    v2[0, :, 4:] = poison
    k2[:, :, 1] = poison
    v2[:, :, 1] = poison
    dirty = backward_arrays(q, k2, v2, dout, **params)
    for a, b in zip(clean[:3], dirty[:3]):
        np.testing.assert_array_equal(a, b)
    assert np.all(dirty.dk[0, :, 4:] == 0) and np.all(dirty.dv[:, :, 1] == 0)


@pytest.mark.clauses("ATTN-GRAD-1")
def test_backward_of_case_uses_grad_out_and_is_cached():
    q, k, v, dout = _problem(23, Hq=4, Hkv=2)
    case = Case.build(q, k, v, grad_out=dout, causal="top_left")
    g = backward(case)
    assert backward(case) is g
    ref = backward_arrays(q, k, v, dout, causal="top_left")
    for a, b in zip(g[:3], ref[:3]):
        np.testing.assert_array_equal(a, b)
    assert g.dbias is None
    with pytest.raises(ValueError, match="grad_out"):
        backward(Case.build(q, k, v))


@pytest.mark.clauses("ATTN-EMPTY-3")
def test_nan_on_padded_query_rows_stays_on_those_rows():
    q, k, v, dout = _problem(24, Lq=4, Lk=5)
    params = {"q_lengths": np.array([4, 2]), "bias": np.random.default_rng(6).standard_normal((1, 2, 4, 5))}
    clean = backward_arrays(q, k, v, dout, **params)
    q2, dout2 = q.copy(), dout.copy()
    q2[1, :, 2:] = np.nan
    dout2[1, :, 3] = np.inf
    dirty = backward_arrays(q2, k, v, dout2, **params)
    np.testing.assert_array_equal(dirty.dk, clean.dk)
    np.testing.assert_array_equal(dirty.dv, clean.dv)
    np.testing.assert_array_equal(dirty.dbias, clean.dbias)
    np.testing.assert_array_equal(dirty.dq[0], clean.dq[0])
    assert np.all(dirty.dq[1, :, 2:] == 0.0)


def test_dropout_backward_matches_finite_differences_of_the_dropped_forward():
    """ATTN-DROP-3: for a fixed keep mask, the gradients of O = (keep * P / (1 - p)) V (with GQA, a bias and
    a softcap on), by central differences."""
    from attnconf.reference import expand_kv

    rng = np.random.default_rng(7)
    hq, hkv, p = 4, 2, 0.3
    q, k, v = rng.normal(size=(2, hq, 5, 3)), rng.normal(size=(2, hkv, 7, 3)), rng.normal(size=(2, hkv, 7, 3))
    bias, dout = rng.normal(size=(2, hq, 5, 7)), rng.normal(size=(2, hq, 5, 3))
    keep = rng.random((2, hq, 5, 7)) >= p

    def loss(q, k, v, bias):
        w = np.where(keep, forward(q, k, v, bias=bias, softcap=2.0).weights / (1 - p), 0.0)
        return float((dout * (w @ expand_kv(v, hq))).sum())

    g = backward_arrays(q, k, v, dout, bias=bias, softcap=2.0, dropout=(keep, p))
    args = {"q": q, "k": k, "v": v, "bias": bias}
    for name, got in (("q", g.dq), ("k", g.dk), ("v", g.dv), ("bias", g.dbias)):
        num = np.zeros_like(args[name])
        for idx in np.ndindex(num.shape):
            hi, lo = dict(args), dict(args)
            hi[name], lo[name] = args[name].copy(), args[name].copy()
            hi[name][idx] += 1e-6
            lo[name][idx] -= 1e-6
            num[idx] = (loss(**hi) - loss(**lo)) / 2e-6
        assert np.abs(num - got).max() < 1e-7, name
    plain = backward_arrays(q, k, v, dout, bias=bias, softcap=2.0)
    assert np.abs(plain.dv - g.dv).max() > 1e-2      # the mask matters
