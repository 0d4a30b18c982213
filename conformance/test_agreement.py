"""Agreement with the float64 reference on every generated case (ATTN-TOL-*).

This is the property that decides certification: across shapes, masks,
causal alignments, GQA, dtypes and value regimes, the kernel's output stays
within the tolerance model of its precision.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, for_cases, judge, run
from attnconf.conformance.engine.tolerance import judge_lse, judge_output

PINNED = st.pinned(st.AGREEMENT_PINS)


@clauses("ATTN-OP-1", "ATTN-OP-2", "ATTN-OP-3", "ATTN-OP-4", "ATTN-DTYPE-1", "ATTN-MASK-1", "ATTN-MASK-2", "ATTN-MASK-4",
         "ATTN-MASK-6", "ATTN-CAUSAL-1", "ATTN-GQA-1", "ATTN-GQA-2", "ATTN-TOL-1", "ATTN-TOL-2", "ATTN-TOL-3",
         "ATTN-TOL-4", "ATTN-OP-8")
@for_cases(st.cases(), examples=PINNED, weight=4)
def test_output_matches_reference(impl, case):
    """The output agrees with the float64 reference within the precision's tolerance."""
    res = run(impl, case)
    if res is not None:
        judge(judge_output(res.out, case), case, impl)
        if res.out_with_lse is not None:   # the output of the call that also returned the lse
            judge(judge_output(res.out_with_lse, case), case, impl)


@clauses("ATTN-W-3", "ATTN-EMPTY-2")
@for_cases(st.cases(layouts=False), weight=1, needs=("lse",))
def test_lse_matches_reference(impl, case):
    """Where the kernel exposes the log-sum-exp, it is the reference's (and -inf for empty rows)."""
    res = run(impl, case, need={"lse"})
    expect(res.lse is not None and res.lse.shape == case.out_shape[:3], "ATTN-W-3",
           f"lse shape {None if res.lse is None else res.lse.shape} != {case.out_shape[:3]}", case, impl)
    judge(judge_lse(res.lse, case), case, impl)
