"""The pinned cases, in every dtype, before any other test (ATTN-OP-1, ATTN-TOL-1..4).

Each pinned case (strategies.AGREEMENT_PINS, strategies.CONVENTION_PINS) targets one way
kernels break: bottom-right causal with Lq != Lk, rows that see no key, GQA and MQA, padding,
masks, windows with either bound, softcap, ALiBi, packed and paged caches, decode. Run first
(harness.first) and in every dtype (only in its own dtype for an implementation that compiles
every new shape, example_budget < 1), they show most bugs within a second of the run's start, so
a kernel author running with -x gets the first failure at once; the Hypothesis properties that
follow then search the rest of the input space. Each case is projected onto the kernel's
declared scope (scope_fit.fit); the lse is judged where the kernel returns one that can be (a
failure there names ATTN-W-3 or ATTN-EMPTY-2, but the test does not cite them: it would count
towards their coverage floor on kernels that return no lse).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, first, for_cases, judge, lse_need, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_lse, judge_output

PINS = st.AGREEMENT_PINS + st.CONVENTION_PINS
FIRST_LOOK = [c for d in st.DTYPES for c in st.pinned(PINS, d)]
NATIVE = {(p["seed"], p.get("dtype", "float32")) for p in PINS}       # each pin in its own dtype


@first(0)
@clauses("ATTN-OP-1", "ATTN-TOL-1", "ATTN-TOL-2", "ATTN-TOL-3", "ATTN-TOL-4")
@for_cases(st.fixed_cases(FIRST_LOOK), examples=FIRST_LOOK, weight=0.01, shares_floor=False)
def test_pinned_cases_match_reference(impl, case):
    """Each pinned case, fitted to the declared scope, agrees with the reference: output, and lse where returned."""
    if getattr(impl, "example_budget", 1.0) < 1 and (case.seed, case.dtype) not in NATIVE:
        return      # it compiles every new shape: only the pins in their own dtype, which the agreement tests reuse
    fitted = fit(case, impl)
    if fitted is None:
        run(impl, case)             # records why the case lies outside the scope
        return
    res = run(impl, fitted)
    judge(judge_output(res.out, fitted), fitted, impl)
    if lse_need(impl, fitted):
        expect(res.lse is not None and res.lse.shape == fitted.out_shape[:3], "ATTN-W-3",
               f"lse shape {None if res.lse is None else res.lse.shape} != {fitted.out_shape[:3]}", fitted, impl)
        judge(judge_lse(res.lse, fitted), fitted, impl)
