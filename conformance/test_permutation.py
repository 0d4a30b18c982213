"""Attention is equivariant in its queries and invariant in its keys (ATTN-PROP-1, ATTN-PROP-2).

A mask or bias applied along the wrong axis, a key-padding mask read as a
query mask, or a kernel that treats key order as meaningful passes many random
comparisons, but breaks these symmetries at once. Both sides run on the
kernel; a kernel is only ever right within the tolerance model, so each run
is judged against the reference of its own case (the references themselves
are exactly related by the permutation), never against the other run bitwise.
Causal masking is positional and excluded; so is query padding (PROP-1) and
all padding (PROP-2), which are positional too. Sinks are drawn where declared: a
per-head sink moves with neither permutation.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, run
from attnconf.reference import Case

PINNED_Q = [
    st.fixed_case(31, Lq=7, Lk=5, mask=np.random.default_rng(2).random((7, 5)) < 0.7),
    st.fixed_case(32, B=2, Hq=4, Hkv=2, Lq=17, Lk=9, Dk=8, dtype="float16", kv_lengths=[9, 3],
                  bias=np.random.default_rng(3).normal(size=(2, 1, 17, 9))),
]
PINNED_K = [
    st.fixed_case(33, Lq=5, Lk=13, mask=np.random.default_rng(4).random((1, 1, 1, 13)) < 0.6),
    st.fixed_case(34, B=2, Hq=2, Lq=9, Lk=33, Dk=16, dtype="bfloat16",
                  bias=np.random.default_rng(5).normal(size=(2, 2, 9, 33))),
]


def permute_axis(arr: np.ndarray | None, perm: np.ndarray, axis_from_end: int, length: int) -> np.ndarray | None:
    """Permute a broadcastable mask/bias along the query (-2) or key (-1) axis, where it is not broadcast."""
    if arr is None or arr.ndim < -axis_from_end or arr.shape[axis_from_end] != length:
        return arr
    return np.take(arr, perm, axis=arr.ndim + axis_from_end)


def permute_queries(case: Case, perm: np.ndarray) -> Case:
    lq = case.shape["Lq"]
    go = None if case.grad_out is None else case.grad_out[:, :, perm]
    return case.replace(q=case.q[:, :, perm], mask=permute_axis(case.mask, perm, -2, lq),
                        bias=permute_axis(case.bias, perm, -2, lq), grad_out=go)


def permute_keys(case: Case, perm: np.ndarray) -> Case:
    lk = case.shape["Lk"]
    return case.replace(k=case.k[:, :, perm], v=case.v[:, :, perm], mask=permute_axis(case.mask, perm, -1, lk),
                        bias=permute_axis(case.bias, perm, -1, lk))


@clauses("ATTN-PROP-1")
@for_cases(st.cases(causal=False, empty_rows=False, max_len=33, sinks=True).map(st.without_q_lengths), examples=PINNED_Q,
           weight=0.25)
def test_query_permutation_equivariance(impl, case):
    """Permuting query rows (with mask and bias rows) permutes the output rows."""
    perm = np.random.default_rng(case.seed).permutation(case.shape["Lq"])
    res = run(impl, case)
    moved = permute_queries(case, perm)
    res2 = run(impl, moved)
    expect_close(res.out, case, impl, clause="ATTN-PROP-1")
    expect_close(res2.out, moved, impl, clause="ATTN-PROP-1")


@clauses("ATTN-PROP-2")
@for_cases(st.cases(causal=False, padding=False, empty_rows=False, max_len=33, sinks=True), examples=PINNED_K, weight=0.25)
def test_key_permutation_invariance(impl, case):
    """Permuting keys and values jointly (with mask and bias columns) leaves the output unchanged."""
    perm = np.random.default_rng(case.seed).permutation(case.shape["Lk"])
    res = run(impl, case)
    moved = permute_keys(case, perm)
    res2 = run(impl, moved)
    expect_close(res.out, case, impl, clause="ATTN-PROP-2")
    expect_close(res2.out, moved, impl, clause="ATTN-PROP-2")
