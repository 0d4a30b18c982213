"""The analytic backward with softcap, window, ALiBi and sinks against central finite differences (float64).

ATTN-CAP-3: the cap's derivative reaches dQ and dK, not dV or dBias. Window and ALiBi change P only.
ATTN-SINK-4: the sink's own gradient, -sum_(b,i) exp(sink - lse) * rowsum(dO * O), and dQ, dK, dV
with the sink-aware P. The finite differences are taken of `forward` itself, so the test checks the
analytic formulas against the definition they claim to differentiate.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.reference import Case, backward, backward_arrays, forward

H = 1e-6


def _loss(arrays, dout, params):
    p = dict(params)
    if "bias" in arrays:
        p["bias"] = arrays["bias"]
    if "sinks" in arrays:
        p["sinks"] = arrays["sinks"]
    return float((forward(arrays["q"], arrays["k"], arrays["v"], **p).out * dout).sum())


def _numeric(arrays, dout, params):
    grads = {}
    for name, arr in arrays.items():
        g = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            if not np.isfinite(arr[idx]):
                continue
            vals = []
            for step in (H, -H):
                moved = arr.copy()
                moved[idx] += step
                vals.append(_loss(dict(arrays, **{name: moved}), dout, params))
            g[idx] = (vals[0] - vals[1]) / (2 * H)
        grads[name] = g
    return grads


def _problem(seed, B=2, Hq=2, Hkv=None, Lq=3, Lk=5, Dk=2, Dv=3):
    rng = np.random.default_rng(seed)
    Hkv = Hq if Hkv is None else Hkv
    return (rng.standard_normal((B, Hq, Lq, Dk)), rng.standard_normal((B, Hkv, Lk, Dk)),
            rng.standard_normal((B, Hkv, Lk, Dv)), rng.standard_normal((B, Hq, Lq, Dv)))


SCENARIOS = {
    "softcap": ({}, {"softcap": 0.8, "scale": 1.7}),
    "softcap_bias": ({}, {"softcap": 1.2, "bias": np.random.default_rng(1).standard_normal((2, 1, 3, 5))}),
    "window_br": ({}, {"window": (1, 0)}),
    "window_tl_empty_rows": ({"Lq": 5, "Lk": 3}, {"window": (0, 0), "window_align": "top_left"}),
    "alibi_gqa": ({"Hq": 4, "Hkv": 2}, {"alibi_slopes": np.array([0.5, 0.25, 0.125, 1.0])}),
    "alibi_batch_causal": ({}, {"alibi_slopes": np.array([[0.3, 0.7], [1.1, 0.2]]), "causal": "bottom_right"}),
    "sinks": ({}, {"sinks": np.array([0.4, -0.6])}),
    "sinks_empty_rows": ({"Lq": 5, "Lk": 3}, {"sinks": np.array([1.5, 0.0]), "causal": "bottom_right"}),
    "everything": ({"Hq": 4, "Hkv": 1}, {"softcap": 1.5, "window": (2, 1), "alibi_slopes": np.array([0.2, 0.4, 0.6, 0.8]),
                                         "sinks": np.array([0.1, -0.3, 0.8, 0.0]),
                                         "bias": np.random.default_rng(2).standard_normal((3, 5)),
                                         "kv_lengths": np.array([4, 5])}),
}


@pytest.mark.clauses("ATTN-CAP-3", "ATTN-SINK-4", "ATTN-GRAD-1", "ATTN-GRAD-2", "ATTN-WIN-3", "ATTN-ALIBI-2",
                     "ATTN-EMPTY-3")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_variant_backward_matches_finite_differences(name):
    shape, params = SCENARIOS[name]
    q, k, v, dout = _problem(len(name), **shape)
    g = backward_arrays(q, k, v, dout, **params)
    arrays = {"q": q, "k": k, "v": v}
    for extra in ("bias", "sinks"):
        if params.get(extra) is not None:
            arrays[extra] = params[extra]
    rest = {key: val for key, val in params.items() if key not in arrays}
    num = _numeric(arrays, dout, rest)
    for key, analytic in (("q", g.dq), ("k", g.dk), ("v", g.dv), ("bias", g.dbias), ("sinks", g.dsinks)):
        if key not in num:
            assert analytic is None, key
            continue
        scale = max(1.0, float(np.abs(num[key]).max()))
        assert analytic.shape == num[key].shape, key
        assert np.abs(analytic - num[key]).max() <= 1e-6 * scale, (key, np.abs(analytic - num[key]).max())


@pytest.mark.clauses("ATTN-CAP-3")
def test_softcap_gradient_vanishes_where_the_cap_saturates():
    """Every |logit| >= 900 against c = 1: tanh' = 1 - tanh^2 is exactly 0 in float64, so dQ and dK are 0
    while dV (which the cap does not touch) is not."""
    _, _, v, dout = _problem(3)
    q = np.array([30.0, -30.0, 31.0]).reshape(1, 1, 3, 1) * np.ones((2, 2, 3, 1))
    k = np.array([30.0, -31.0, 32.0, 30.5, -30.0]).reshape(1, 1, 5, 1) * np.ones((2, 2, 5, 1))
    g = backward_arrays(q, k, v, dout, softcap=1.0, scale=1.0)
    assert np.all(g.dq == 0) and np.all(g.dk == 0)
    assert np.abs(g.dv).max() > 1e-2


@pytest.mark.clauses("ATTN-SINK-4")
def test_sink_gradient_closed_form_and_case_path():
    """One key (logit 0), sink 0, V = [2], dO = [1]: O = 1, lse = ln 2, P_sink = 1/2, dsink = -1/2 * 1 * 1."""
    q = np.zeros((1, 1, 1, 1))
    k = np.zeros((1, 1, 1, 1))
    v = np.array([[[[2.0]]]])
    g = backward_arrays(q, k, v, np.ones((1, 1, 1, 1)), sinks=np.array([0.0]))
    assert g.dsinks.shape == (1,) and g.dsinks[0] == pytest.approx(-0.5, abs=1e-15)
    case = Case.build(q, k, v, sinks=np.array([0.0]), grad_out=np.ones((1, 1, 1, 1)))
    assert backward(case).dsinks[0] == pytest.approx(-0.5, abs=1e-15)
    assert backward(Case.build(q, k, v, grad_out=np.ones((1, 1, 1, 1)))).dsinks is None
