"""Numerical stability under large, overflowing, mixed-magnitude and near-tied logits (ATTN-PROP-13).

A kernel that exponentiates without subtracting the row maximum, or keeps a
running maximum wrongly, is exact on ordinary inputs and breaks only here:
scaled logits up to about 1e4, logits of 50..200 where exp() overflows float16,
bfloat16 and float32, rows whose logit ranges differ by orders of magnitude,
and nearly tied top logits. Outputs must stay finite where the reference is
finite, and within the tolerance model.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, run
from attnconf.reference import oracle

HARD_REGIMES = ("large", "overflow", "mixed", "near_ties")
PINS = [st.fixed_case(50, Lq=9, Lk=33, Dk=64, regime="overflow", dtype="float16"),
        st.fixed_case(51, Lq=4, Lk=17, Dk=16, regime="large", dtype="float32"),
        st.fixed_case(52, Lq=8, Lk=8, Dk=8, regime="mixed", dtype="bfloat16", causal="top_left")]


@clauses("ATTN-PROP-13", "ATTN-TOL-3")
@for_cases(st.cases(regimes=HARD_REGIMES, max_len=129), examples=PINS, weight=0.6)
def test_hard_logits_stay_finite_and_accurate(impl, case):
    """Large (~1e4), overflowing (50..200), mixed-magnitude and near-tied logits give finite outputs
    within tolerance."""
    res = run(impl, case)
    finite = np.isfinite(oracle(case).out)
    bad = np.argwhere(finite & ~np.isfinite(res.out))
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        expect(False, "ATTN-PROP-13", f"{len(bad)} non-finite output entries in the {case.regime} regime; first at "
               f"{i}: {res.out[i]}", case, impl)
    expect_close(res.out, case, impl, clause="ATTN-PROP-13")
