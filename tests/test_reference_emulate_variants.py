"""The dtype-emulated baselines with windows, softcap, ALiBi and sinks (SPEC section 12.5).

The yardstick must really compute each variant (converge to the float64 reference as the precision
grows, get the sink into the lse, keep window-hidden keys out), at the precision of t (its error is
of the order of eps_t, neither 0 nor wild), for forward and backward.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attnconf.reference import Case, backward, baseline_error, naive_backward, naive_forward, numpy_dtype, oracle


def _eps(dtype: str) -> float:
    return float(ml_dtypes.finfo(numpy_dtype(dtype)).eps)


VARIANTS = {
    "window": dict(window=(5, 2), causal="bottom_right"),
    "window_top_left_empty_rows": dict(window=(2, 0), window_align="top_left", Lq=24),
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi_slopes=2.0 ** -np.arange(1.0, 5.0)),
    "alibi_batch": dict(alibi_slopes=np.random.default_rng(3).uniform(0, 0.5, (2, 4)), window_align="top_left"),
    "sinks": dict(sinks=np.array([0.5, 2.0, -1.0, 3.0])),
    "all": dict(window=(6, 0), softcap=2.0, alibi_slopes=2.0 ** -np.arange(1.0, 5.0), sinks=np.array([0.5, 2.0, -1.0, 3.0])),
}


def _case(dtype, name, seed=0, grad=False):
    p = dict(VARIANTS[name])
    lq = p.pop("Lq", 12)
    rng = np.random.default_rng(seed)
    extra = {"grad_out": rng.standard_normal((2, 4, lq, 16))} if grad else {}
    return Case.build(rng.standard_normal((2, 4, lq, 16)), rng.standard_normal((2, 2, 20, 16)),
                      rng.standard_normal((2, 2, 20, 16)), dtype=dtype, **extra, **p)


@pytest.mark.clauses("ATTN-TOL-1", "ATTN-WIN-1", "ATTN-CAP-1", "ATTN-ALIBI-1", "ATTN-SINK-1")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_naive_forward_with_variants_is_of_dtype_order(dtype, name):
    case = _case(dtype, name, seed=len(name))
    ref = oracle(case)
    out, lse = naive_forward(case)
    vmax, eps = np.abs(case.v).max(), _eps(dtype)
    err = np.abs(out - ref.out).max()
    assert 0.02 * eps * vmax <= err <= 10 * eps * vmax, err / (eps * vmax)
    empty = ~ref.visible.any(axis=-1)
    assert np.all(out[empty] == 0)
    fin = np.isfinite(ref.lse)
    assert np.array_equal(np.isfinite(lse), fin)          # with sinks every lse is finite, empty rows included
    assert np.abs(lse[fin] - ref.lse[fin]).max() <= 10 * eps * max(1.0, np.abs(ref.lse[fin]).max())
    assert baseline_error(case)[0].max() >= err           # the envelope holds every variant, this one included


@pytest.mark.clauses("ATTN-TOL-1")
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_naive_forward_converges_with_precision(name):
    """Emulating a float16 case in float32 is far closer to the float64 reference: the variant is
    computed, not approximated by something else."""
    case = _case("float16", name, seed=1)
    ref = oracle(case).out
    e16 = np.abs(naive_forward(case)[0] - ref).max()
    e32 = np.abs(naive_forward(case, dtype="float32")[0] - ref).max()
    assert e32 < e16 * 1e-2


@pytest.mark.clauses("ATTN-TOL-5", "ATTN-CAP-3", "ATTN-SINK-4")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["softcap", "alibi", "sinks", "all", "window_top_left_empty_rows"])
def test_naive_backward_with_variants_is_of_dtype_order(dtype, name):
    case = _case(dtype, name, seed=len(name) + 1, grad=True)
    base = naive_backward(case)
    ref = backward(case)._asdict()
    eps = _eps(dtype)
    expected = {"dq", "dk", "dv"} | ({"dsinks"} if case.sinks is not None else set())
    assert set(base) == expected
    for key in expected:
        r = ref[key]
        rel = np.abs(base[key] - r).max() / np.abs(r).max()
        assert 0.02 * eps <= rel <= 30 * eps, (key, rel / eps)


@pytest.mark.clauses("ATTN-TOL-5", "ATTN-CAP-3")
def test_naive_backward_softcap_converges_with_precision():
    case = _case("float16", "softcap", seed=4, grad=True)
    ref = backward(case)
    assert np.abs(naive_backward(case, "float32")["dq"] - ref.dq).max() < 1e-2 * np.abs(naive_backward(case)["dq"] - ref.dq).max()
