"""Gradients of sum(dO * out) agree with the analytic float64 backward (ATTN-GRAD-*, ATTN-TOL-5).

Judged by the same model as the forward pass, with the gradient multipliers of
spec/tolerances.toml and a naive backward emulated at the dtype as yardstick.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, for_cases, judge, run
from attnconf.conformance.engine.tolerance import judge_gradients


@clauses("ATTN-GRAD-1", "ATTN-GRAD-2", "ATTN-TOL-5")
@for_cases(st.cases(grad=True, max_len=129, layouts=False), weight=1,
           examples=[st.fixed_case(11, B=2, Hq=4, Hkv=2, Lq=9, Lk=17, Dk=16, grad_out=np.ones((2, 4, 9, 16)),
                                   causal="bottom_right"),
                     # keys over several 128-key blocks, then a wide head: backward kernels tile both
                     st.fixed_case(12, Hq=2, Hkv=1, Lq=33, Lk=257, Dk=32,
                                   grad_out=np.random.default_rng(12).normal(size=(1, 2, 33, 32))),
                     st.fixed_case(13, Hq=1, Lq=9, Lk=129, Dk=256,
                                   grad_out=np.random.default_rng(13).normal(size=(1, 1, 9, 256)))],
           needs=("grads",))
def test_gradients_match_reference(impl, case):
    """dQ, dK, dV (and dBias where the backend returns it) match the float64 backward."""
    res = run(impl, case, grads=True)
    expect(res.grads is not None and {"dq", "dk", "dv"} <= set(res.grads), "ATTN-GRAD-1",
           f"gradients missing: got {sorted(res.grads or {})}", case, impl)
    for name, shape in (("dq", case.q.shape), ("dk", case.k.shape), ("dv", case.v.shape)):
        expect(res.grads[name].shape == shape, "ATTN-GRAD-1", f"{name} shape {res.grads[name].shape} != {shape}",
               case, impl)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)


@clauses("ATTN-EMPTY-3", "ATTN-GRAD-1")
@for_cases(st.cases(grad=True, max_len=33, layouts=False, masks=True, padding=False), weight=0.5,
           needs=("grads", "mask"))
def test_fully_masked_rows_have_zero_gradients(impl, case):
    """A query row with no visible key has dQ = 0 and adds nothing to dK, dV."""
    rng = np.random.default_rng(case.seed)
    lq, lk = case.shape["Lq"], case.shape["Lk"]
    mask = rng.random((case.shape["B"], 1, lq, lk)) < 0.6
    mask[:, :, int(rng.integers(lq)), :] = False
    case = case.replace(mask=mask, causal=None, bias=None)
    res = run(impl, case, grads=True)
    empty = ~mask.any(axis=-1)                          # (B, 1, Lq)
    dq = res.grads["dq"]
    rows = np.broadcast_to(empty, dq.shape[:3])
    expect(bool((dq[rows] == 0).all()), "ATTN-EMPTY-3", "dQ of a fully-masked row is not exactly 0", case, impl)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)
