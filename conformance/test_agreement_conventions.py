"""Agreement with the float64 reference on the cases modern kernels take (ATTN-WIN-1, ATTN-CAP-1, ATTN-ALIBI-1).

`strategies.convention_cases` draws bottom-right causal (top-left where Lq == Lk), sliding
windows (left, right) with either alignment, softcap, ALiBi slopes per head or per (batch,
head), GQA, per-sequence lengths and custom scales; `scope_fit.fit` turns off what the
implementation does not declare, so a flash-attention-convention kernel gets windows and
ALiBi and an SDPA kernel gets causal and padding. Outputs and, where the kernel has them,
gradients are judged by the tolerance model of section 12.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, for_cases, judge, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_gradients, judge_output

PINNED = st.pinned(st.CONVENTION_PINS)      # explicit examples first: see strategies.CONVENTION_PINS


@clauses("ATTN-OP-1", "ATTN-TOL-1", "ATTN-CAUSAL-1", "ATTN-GQA-1", "ATTN-WIN-1", "ATTN-CAP-1", "ATTN-ALIBI-1")
@for_cases(st.convention_cases(), examples=PINNED, weight=2, needs=("window_top_left|window_bottom_right|softcap|alibi|alibi_top_left|varlen|paged|kvcache_append",))
def test_convention_cases_match_reference(impl, case):
    """Windows, softcap, ALiBi, alignments and lengths, within the kernel's scope, agree with the reference."""
    fitted = fit(case, impl)
    if fitted is None:
        run(impl, case)
        return
    res = run(impl, fitted)
    if res is not None:
        judge(judge_output(res.out, fitted), fitted, impl)


@clauses("ATTN-GRAD-1", "ATTN-TOL-5", "ATTN-WIN-1", "ATTN-CAP-1", "ATTN-ALIBI-1")
@for_cases(st.convention_cases(grad=True, max_len=33), examples=[
    c.replace(grad_out=np.random.default_rng(c.seed).normal(size=c.out_shape), dtype="float64") for c in PINNED[:8]],
    weight=0.5, needs=("window_top_left|window_bottom_right|softcap|alibi|alibi_top_left|varlen|paged|kvcache_append", "grads"))
def test_convention_gradients_match_reference(impl, case):
    """Gradients through windows, softcap and ALiBi agree with the analytic backward."""
    fitted = fit(case, impl, need={"grads"})
    if fitted is None:
        run(impl, case, grads=True)
        return
    res = run(impl, fitted, grads=True)
    for j in judge_gradients(res.grads, fitted):
        judge(j, fitted, impl)
