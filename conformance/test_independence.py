"""Batch elements and heads do not talk to each other (ATTN-PROP-12).

Kernels flatten (B, H) into one grid axis, index per-batch masks and lengths,
and map query heads to KV heads; an off-by-one in any of that mixes rows of
different problems. Running one batch element, or a subset of query heads with
their KV heads, alone must reproduce the corresponding rows of the full run.
Both runs are judged against the reference of the sliced problem, so they
agree with each other within the sum of their allowances; bitwise agreement is
not required (a kernel may tile a smaller grid differently).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, run
from attnconf.reference import Case

PINNED = [
    st.fixed_case(41, B=3, Hq=4, Hkv=2, Lq=9, Lk=17, Dk=8, kv_lengths=[17, 0, 5], causal="bottom_right"),
    st.fixed_case(42, B=2, Hq=3, Lq=5, Lk=5, dtype="float16",
                  mask=np.random.default_rng(6).random((2, 3, 5, 5)) < 0.6),
    st.fixed_case(43, B=2, Hq=8, Hkv=1, Lq=4, Lk=7, Dk=16, dtype="bfloat16", q_lengths=[4, 2],
                  bias=np.random.default_rng(7).normal(size=(1, 8, 4, 7))),
]


def take(arr: np.ndarray | None, axis: int, idx: np.ndarray, full: int) -> np.ndarray | None:
    """Select `idx` along batch (0) or head (1) of a mask/bias, broadcast axes left alone."""
    if arr is None:
        return None
    a = arr.reshape((1,) * (4 - arr.ndim) + arr.shape)
    return np.take(a, idx, axis=axis) if a.shape[axis] == full and full > 1 else a


def slice_case(case: Case, batch: np.ndarray | None = None, heads: np.ndarray | None = None,
               kv_heads: np.ndarray | None = None) -> Case:
    """The sub-problem of some batch elements, or of some query heads with the KV heads they use."""
    s = case.shape
    q, k, v, go = case.q, case.k, case.v, case.grad_out
    mask, bias, ql, kl = case.mask, case.bias, case.q_lengths, case.kv_lengths
    if batch is not None:
        q, k, v = q[batch], k[batch], v[batch]
        go = None if go is None else go[batch]
        mask, bias = take(mask, 0, batch, s["B"]), take(bias, 0, batch, s["B"])
        ql = None if ql is None else ql[batch]
        kl = None if kl is None else kl[batch]
    if heads is not None:
        q, k, v = q[:, heads], k[:, kv_heads], v[:, kv_heads]
        go = None if go is None else go[:, heads]
        mask, bias = take(mask, 1, heads, s["Hq"]), take(bias, 1, heads, s["Hq"])
    return case.replace(q=q, k=k, v=v, grad_out=go, mask=mask, bias=bias, q_lengths=ql, kv_lengths=kl)


def head_subset(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray] | None:
    """(query heads, KV heads): any query heads under MQA, else whole KV groups; None if only one head."""
    hq, hkv = case.shape["Hq"], case.shape["Hkv"]
    if hq == 1:
        return None
    if hkv == 1:
        return np.sort(rng.choice(hq, size=int(rng.integers(1, hq)), replace=False)), np.array([0])
    kv = np.sort(rng.choice(hkv, size=int(rng.integers(1, hkv)), replace=False))
    g = hq // hkv
    return (kv[:, None] * g + np.arange(g)[None, :]).ravel(), kv


@clauses("ATTN-PROP-12")
@for_cases(st.cases(max_len=33, empty_rows=False), examples=PINNED, weight=0.3)
def test_batch_and_head_slices(impl, case):
    """One batch element, or a subset of heads (whole KV groups), run alone gives the full run's rows."""
    s = case.shape
    rng = np.random.default_rng(case.seed)
    chosen = head_subset(case, rng)
    if s["B"] > 1 and (chosen is None or rng.random() < 0.5):
        batch = np.array([int(rng.integers(s["B"]))])
        sub, rows = slice_case(case, batch=batch), (batch,)
    elif chosen is not None:
        sub, rows = slice_case(case, heads=chosen[0], kv_heads=chosen[1]), (slice(None), chosen[0])
    else:
        return                                            # B = Hq = 1: nothing to slice
    full = run(impl, case)
    res = run(impl, sub)
    expect_close(full.out[rows], sub, impl, clause="ATTN-PROP-12")
    expect_close(res.out, sub, impl, clause="ATTN-PROP-12")
