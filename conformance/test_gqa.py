"""Grouped-query and multi-query attention mean repeat_interleave of the KV heads (ATTN-GQA-1, -2).

Query head h uses KV head h // (Hq / Hkv). The tempting alternative, h mod Hkv
(tiling), agrees with it whenever Hkv = 1 or the KV heads are equal, so the
cases here have 2 to 4 visibly different KV heads in groups of 2 to 4, and
separately Hkv = 1 (MQA), which some backends reject or mis-broadcast. The GQA
run and the run with K and V expanded to Hq heads (plain multi-head attention)
are each judged against the reference of their own case; the two references
are the same numbers, so the runs agree within the sum of their allowances.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, run
from attnconf.reference import Case, expand_kv

PINNED_GQA = [
    st.fixed_case(51, B=1, Hq=4, Hkv=2, Lq=5, Lk=7, Dk=8),
    st.fixed_case(52, B=2, Hq=6, Hkv=3, Lq=17, Lk=17, Dk=16, causal="top_left", dtype="float16"),
    st.fixed_case(53, B=2, Hq=8, Hkv=4, Lq=9, Lk=4, Dk=8, causal="bottom_right", dtype="bfloat16",
                  kv_lengths=[4, 2]),
]
PINNED_MQA = [
    st.fixed_case(54, B=2, Hq=4, Hkv=1, Lq=5, Lk=7, Dk=8),
    st.fixed_case(55, B=1, Hq=8, Hkv=1, Lq=33, Lk=13, Dk=16, causal="bottom_right", dtype="float64",
                  mask=np.random.default_rng(8).random((1, 8, 33, 13)) < 0.8),
]


def expanded(case: Case) -> Case:
    """The same problem as multi-head attention: K and V repeat-interleaved to Hq heads."""
    hq = case.shape["Hq"]
    return case.replace(k=expand_kv(case.k, hq), v=expand_kv(case.v, hq))


def check_against_mha(impl, case: Case, clause: str) -> None:
    res = run(impl, case)
    expect_close(res.out, case, impl, clause=clause)
    mha = expanded(case)
    res2 = run(impl, mha)
    expect_close(res2.out, mha, impl, clause=clause)
    expect_close(res.out, mha, impl, clause=clause)


@clauses("ATTN-GQA-1")
@for_cases(st.gqa_cases(max_len=33, empty_rows=False), examples=PINNED_GQA, weight=0.25, needs=("gqa",))
def test_gqa_is_repeat_interleave(impl, case):
    """With 1 < Hkv < Hq, the output equals that of K, V repeat-interleaved to Hq heads."""
    check_against_mha(impl, case, "ATTN-GQA-1")


@clauses("ATTN-GQA-2")
@for_cases(st.gqa_cases(max_len=33, mqa=True, empty_rows=False), examples=PINNED_MQA, weight=0.25, needs=("gqa",))
def test_mqa_single_kv_head(impl, case):
    """With Hkv = 1, every query head attends with the one KV head."""
    check_against_mha(impl, case, "ATTN-GQA-2")
