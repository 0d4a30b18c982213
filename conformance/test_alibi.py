"""ALiBi (ATTN-ALIBI-1, -2): the bias -m |i + off - j|, per head or per batch and head, after the cap.

What goes wrong: the sign (adding +m |d|), a signed distance (m (j - i), FlashInfer's form), the
offset (top-left where the convention is bottom-right, or the batch's padded lengths ignored), the
slope layout ((B, Hq) read as (Hq,)), a bias that is right only up to a row constant (harmless for
the output, wrong for the lse). Beyond agreement with the reference: with Q = 0 and V = I the output
*is* the normalised ALiBi weight row, and ALiBi equals its explicit bias in output and lse.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import (clauses, expect, expect_agree, expect_close, for_cases, judge,
                                          lse_need, reference_gap, run)
from attnconf.conformance.engine.tolerance import judge_gradients, judge_lse
from attnconf.reference import oracle


@clauses("ATTN-ALIBI-1", "ATTN-WIN-2")
@for_cases(st.alibi_cases(), weight=0.6,
           examples=[st.fixed_case(81, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, alibi_slopes=2.0 ** -np.arange(1.0, 5.0)),
                     st.fixed_case(82, B=2, Hq=2, Lq=7, Lk=5, Dk=8, dtype="float16", window_align="top_left",
                                   alibi_slopes=np.array([[0.5, 0.25], [1.0, 0.0]]), causal="top_left")], needs=("alibi|alibi_top_left",))
def test_alibi_matches_reference(impl, case):
    """Cases with ALiBi ((Hq,) or (B, Hq) slopes, either alignment, causal, padding, windows) agree with the reference."""
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-ALIBI-1")


@clauses("ATTN-ALIBI-1", "ATTN-ALIBI-2")
@for_cases(st.alibi_probe_cases(), weight=0.4, needs=("alibi|alibi_top_left",))
def test_alibi_weights_are_the_bias(impl, case):
    """Q = 0, V = I: row i's output is exp(-m |i + off - j|) normalised over the visible keys; a flipped sign,
    a signed distance, a wrong offset or alignment moves these weights by O(1)."""
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-ALIBI-1")


@clauses("ATTN-ALIBI-2", "ATTN-LSE-1")
@for_cases(st.alibi_cases(max_len=33), weight=0.4, needs=("alibi|alibi_top_left",))
def test_alibi_equals_its_explicit_bias(impl, case):
    """ALiBi and the explicit bias it denotes give the same output and, where the kernel returns it, the
    same lse (the bias's row constant included: ATTN-ALIBI-2)."""
    explicit = st.alibi_as_bias(case)
    need = lse_need(impl, case)
    r1, r2 = run(impl, case, need=need), run(impl, explicit, need=need)
    j1 = expect_close(r1.out, case, impl, clause="ATTN-ALIBI-2")
    j2 = expect_close(r2.out, explicit, impl, clause="ATTN-ALIBI-2")
    expect_agree(r1.out, j1, r2.out, j2, gap=reference_gap(case, explicit), clause="ATTN-ALIBI-2",
                 what="ALiBi vs its explicit bias", case=case, impl=impl)
    if r1.lse is None or r2.lse is None:
        return
    l1 = judge(judge_lse(r1.lse, case), case, impl, "ATTN-ALIBI-2")
    l2 = judge(judge_lse(r2.lse, explicit), explicit, impl, "ATTN-ALIBI-2")
    ref1, ref2 = oracle(case).lse, oracle(explicit).lse
    fin = np.isfinite(ref1) & np.isfinite(ref2)
    gap = float(np.abs(ref1[fin] - ref2[fin]).max(initial=0.0))
    d = float(np.abs(r1.lse[fin] - r2.lse[fin]).max(initial=0.0))
    expect(d <= l1.allowed_max + l2.allowed_max + gap, "ATTN-ALIBI-2",
           f"lse with ALiBi and with its explicit bias differ by {d:.3g} > {l1.allowed_max + l2.allowed_max + gap:.3g} "
           f"(a bias right only up to a row constant shifts the lse)", case, impl)


@clauses("ATTN-ALIBI-2", "ATTN-GRAD-1", "ATTN-TOL-5")
@for_cases(st.alibi_cases(grad=True, max_len=33), weight=0.3, needs=("alibi|alibi_top_left", "grads"))
def test_alibi_gradients(impl, case):
    """dQ, dK, dV with ALiBi agree with the float64 backward (ALiBi changes P only)."""
    res = run(impl, case, grads=True)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)
