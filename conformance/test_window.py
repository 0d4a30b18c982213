"""Sliding windows (ATTN-WIN-1..4): inclusive bounds around the aligned diagonal, and what they combine with.

Window bugs are off-by-one bugs: a bound that is exclusive where the spec says inclusive, `(w, w)` where
`(w, 0)` was meant, a diagonal aligned top-left where the convention is bottom-right. So beyond agreement
with the reference, the bounds themselves are probed: with Q = 0 every visible key of a row has weight
1/|J|, and with V = the identity the output row is the weight row, so the key at each inclusive bound
must carry 1/|J| and the key one past it exactly 0 (ATTN-W-2).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import (clauses, expect, expect_close, expect_equivalent, for_cases, judge,
                                          lse_need, run)
from attnconf.conformance.engine.tolerance import judge_gradients, judge_lse
from attnconf.reference import Case, oracle, visibility
from attnconf.spec.vocabulary import ALIGNMENTS


def window_as_mask(case: Case) -> Case:
    """The case without its window, whose boolean mask is the window's visibility (and'ed with its own mask)."""
    s = case.shape
    vis = visibility((s["B"], 1, s["Lq"], s["Lk"]), window=case.window, window_align=case.window_align,
                     q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
    mask = vis if case.mask is None else np.logical_and(case.mask, vis)
    return case.replace(window=None, mask=mask)


@clauses("ATTN-WIN-1", "ATTN-WIN-2", "ATTN-WIN-3")
@for_cases(st.window_cases(), weight=0.6,
           examples=[st.fixed_case(61, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, window=(3, 0)),
                     st.fixed_case(62, Lq=13, Lk=6, Dk=8, window=(2, 1), dtype="bfloat16"),
                     st.fixed_case(63, Lq=7, Lk=12, Dk=8, window=(1, 2), window_align="top_left", dtype="float16",
                                   causal="top_left")], needs=("window_top_left|window_bottom_right",))
def test_window_matches_reference(impl, case):
    """A windowed case (either alignment, one- or two-sided, with causal, masks, padding) agrees with the reference."""
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-WIN-1")


@clauses("ATTN-WIN-3", "ATTN-MASK-2")
@for_cases(st.window_cases(max_len=33), weight=0.3, needs=("window_top_left|window_bottom_right",))
def test_window_equals_the_mask_it_denotes(impl, case):
    """A window and the boolean mask of ATTN-WIN-1 it denotes give the same output."""
    expect_equivalent(impl, case, window_as_mask(case), clause="ATTN-WIN-3", what="window vs its boolean mask")


@clauses("ATTN-WIN-1", "ATTN-WIN-2", "ATTN-W-2")
@for_cases(st.window_probe_cases(), weight=0.6, needs=("window_top_left|window_bottom_right",))
def test_window_bounds_are_inclusive(impl, case):
    """With Q = 0 and V = I, the keys at the bounds i + off - left and i + off + right carry weight 1/|J|
    and the keys one past them carry exactly 0."""
    res = run(impl, case)
    ref = oracle(case)
    s = case.shape
    left, right = case.window
    for b in range(s["B"]):
        ql = s["Lq"] if case.q_lengths is None else int(case.q_lengths[b])
        kl = s["Lk"] if case.kv_lengths is None else int(case.kv_lengths[b])
        off = 0 if case.window_align == "top_left" else kl - ql
        for h in range(s["Hq"]):
            for i in range(s["Lq"]):
                n = int(ref.visible[b, h, i].sum())
                if n == 0:
                    continue
                row = res.out[b, h, i]
                for side, bound, past in (("left", i + off - left, i + off - left - 1),
                                          ("right", i + off + right, i + off + right + 1)):
                    if (left if side == "left" else right) < 0:
                        continue
                    if 0 <= bound < s["Lk"] and ref.visible[b, h, i, bound]:
                        expect(row[bound] >= 0.5 / n, "ATTN-WIN-1",
                               f"row {(b, h, i)}: key {bound} on the {side} bound (window {case.window}, "
                               f"{case.window_align}, off={off}) has weight {row[bound]:.4g}, expected 1/{n}: the "
                               f"bound is inclusive", case, impl)
                    if 0 <= past < s["Lk"] and not ref.visible[b, h, i, past]:
                        expect(row[past] == 0, "ATTN-WIN-1",
                               f"row {(b, h, i)}: key {past}, one past the {side} bound (window {case.window}, "
                               f"{case.window_align}, off={off}), has weight {row[past]:.4g}, not exactly 0",
                               case, impl)
    expect_close(res.out, case, impl, clause="ATTN-WIN-1")


@clauses("ATTN-WIN-4", "ATTN-CAUSAL-1")
@for_cases(st.cases(max_len=65, causal=False), weight=0.3, needs=("window_top_left|window_bottom_right",))
def test_causal_is_the_window_minus_one_zero(impl, case):
    """Window (-1, 0) with alignment a equals causal masking with alignment a; window (-1, -1) equals none."""
    align = ALIGNMENTS[case.seed % 2]
    expect_equivalent(impl, case.replace(causal=align), case.replace(window=(-1, 0), window_align=align),
                      clause="ATTN-WIN-4", what=f"window (-1, 0)@{align} vs causal={align}")
    expect_equivalent(impl, case, case.replace(window=(-1, -1), window_align=align), clause="ATTN-WIN-4",
                      what="window (-1, -1) vs no window")


@clauses("ATTN-WIN-3", "ATTN-EMPTY-1", "ATTN-EMPTY-2", "ATTN-LSE-2")
@for_cases(st.window_empty_row_cases(), weight=0.4, needs=("window_top_left|window_bottom_right",))
def test_rows_the_window_empties_are_zero(impl, case):
    """Rows that the window leaves without a key (bottom-right with Lq > Lk + right, top-left with
    Lq > Lk + left) output exactly 0, and their lse is -inf where the kernel returns one."""
    empty = ~oracle(case).visible.any(axis=-1)
    assert empty.any()
    res = run(impl, case, need=lse_need(impl, case))
    bad = np.argwhere(empty & ~(res.out == 0).all(axis=-1))
    expect(bad.size == 0, "ATTN-EMPTY-1", f"{len(bad)} of {int(empty.sum())} rows the window empties are not exactly 0; "
           f"first at {tuple(int(i) for i in bad[0]) if bad.size else None}", case, impl)
    if res.lse is not None:
        judge(judge_lse(res.lse, case), case, impl, "ATTN-LSE-2")
    expect_close(res.out, case, impl, clause="ATTN-WIN-3")


@clauses("ATTN-WIN-3", "ATTN-GRAD-1", "ATTN-TOL-5")
@for_cases(st.window_cases(grad=True, max_len=33), weight=0.3, needs=("window_top_left|window_bottom_right", "grads"))
def test_window_gradients(impl, case):
    """dQ, dK, dV with a window agree with the float64 backward (the window changes P only)."""
    res = run(impl, case, grads=True)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)
