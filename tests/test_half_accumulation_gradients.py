"""The `half_accumulation_gradients` alternative (TF-EAGER-*-ACCUMULATION-GRADS): gradients held to the
backward of a naive implementation whose every product accumulates in the half type. It must accept that
backward's own gradients where the spec rejects them, accept conforming gradients, and reject gradients
that err well beyond it."""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.adapters.base import Result
from attnconf.conformance.engine import alternatives
from attnconf.conformance.engine.tolerance import judge_gradients
from attnconf.reference import Case
from attnconf.reference.backward import backward
from attnconf.reference.emulate_half_backward import naive_backward_half_accumulation
from attnconf.spec.vocabulary import HALF_DTYPES

ENTRY = {"instead": "half_accumulation_gradients", "quantities": ["dv"], "bound": 1.0}


def _case(dtype: str = "bfloat16", bias: bool = False) -> Case:
    """Long dot products over the head dim (256): the logits' half accumulation shows in dV."""
    rng = np.random.default_rng(21)
    q, k, v = rng.normal(size=(1, 2, 8, 256)), rng.normal(size=(1, 2, 16, 256)), rng.normal(size=(1, 2, 16, 256))
    return Case.build(q, k, v, grad_out=rng.normal(size=(1, 2, 8, 256)), dtype=dtype,
                      bias=rng.normal(size=(1, 1, 8, 16)) if bias else None)


def _check(case: Case, grads: dict[str, np.ndarray]) -> alternatives.Verdict:
    alternatives.load_all()
    res = Result(out=np.zeros(case.out_shape), out_dtype=case.dtype, grads=grads)
    masks = {n: np.ones(np.shape(g), bool) for n, g in grads.items() if n in ENTRY["quantities"]}
    return alternatives.ALTERNATIVES["half_accumulation_gradients"].check(ENTRY, case, res, masks)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_the_half_accumulating_backward_fails_the_spec_and_passes_the_alternative(dtype):
    case = _case(dtype)
    half = naive_backward_half_accumulation(case, "ascending", "logits")
    dv = next(j for j in judge_gradients(half, case) if j.quantity == "dv")
    assert not dv.ok, dv
    assert _check(case, half).ok


def test_conforming_gradients_pass_and_gradients_far_beyond_it_fail():
    case = _case(bias=True)
    ref = backward(case)
    exact = {"dq": ref.dq, "dk": ref.dk, "dv": ref.dv}
    assert _check(case, exact).ok
    half = naive_backward_half_accumulation(case, "ascending", "q")
    assert set(half) == {"dq", "dk", "dv", "dbias"}
    worse = dict(exact, dv=ref.dv + 5 * (half["dv"] - ref.dv))
    v = _check(case, worse)
    assert not v.ok and "dv (half accumulation)" in v.detail


def test_it_concerns_half_types_with_an_output_gradient():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 1, 2, 4))
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        naive_backward_half_accumulation(Case.build(q, q, q, grad_out=q, dtype="float32"))
    with pytest.raises(ValueError, match="grad_out"):
        naive_backward_half_accumulation(Case.build(q, q, q, dtype="float16"))
    assert not _check(Case.build(q, q, q, grad_out=q, dtype="float32"), {"dv": q}).ok


def test_an_entry_that_claims_the_same_gradients_judges_them_with_the_half_accumulation_error():
    """TF-KERAS-EMPTY-DV covers every dV of a group with an emptied row: with a half-accumulation entry
    applied too, its uniform_weight_gradients allows the visible rows' half-accumulated dV, and only then."""
    from attnconf.reference.backward import group_sum

    base = _case("float16")
    mask = np.ones((1, 1, 8, 16), bool)
    mask[..., 0, :] = False                                # row 0 sees no key
    case = base.replace(mask=mask)
    rows = np.zeros((1, 2, 8), bool)
    rows[..., 0] = True
    w = alternatives.uniform_weights(case, rows)
    half = naive_backward_half_accumulation(case, "ascending", "logits")
    keras = dict(half, dv=half["dv"] + group_sum(np.swapaxes(w, -1, -2) @ case.grad_out, case.shape["Hkv"]))
    res = Result(out=np.zeros(case.out_shape), out_dtype=case.dtype, grads=keras)
    entry = {"instead": "uniform_weight_gradients", "quantities": ["dv"]}
    masks = {"dv": np.ones(case.k.shape[:3] + (case.v.shape[-1],), bool)}
    assert not alternatives.check(entry, case, res, masks).ok
    assert alternatives.check(entry, case, res, masks, half_accumulated=frozenset({"dv"})).ok
