"""DeepSeek sparse attention (ATTN-SPARSE-1..3): top-k key indices per query are a set.

Runs where an implementation takes index lists (`sparse_indices` in its scope: the
`flashmla_sparse` convention, adapters/conventions/flashmla_sparse.py). That adapter turns a
case's visibility into index lists, padded with -1 and indices >= s_kv, in an order drawn from
the case seed and, with `packing["sparse_duplicates"]`, with some indices listed twice; every
case it runs therefore also checks that invalid indices are masked and never read.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, judge, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_lse
from attnconf.reference import Case, oracle
from attnconf.reference.sparse import max_logits as reference_max_logits

NEED = {"sparse_indices"}
U32 = 2.0**-24      # the kernels' float32 statistics


def _fitted(impl, case: Case, **packing) -> Case | None:
    fitted = fit(case, impl, need=NEED)
    if fitted is None:
        run(impl, case, need=NEED)               # recorded as unsupported, with its reason
        return None
    return fitted.replace(packing={**fitted.packing, **packing}) if packing else fitted


@clauses("ATTN-SPARSE-2", "ATTN-EMPTY-1")
@for_cases(st.empty_row_cases(), weight=0.4, needs=("sparse_indices",))
def test_invalid_indices_are_masked(impl, case):
    """Rows padded with -1 and indices past the keys (the last kv row is a poisoned spare row, where
    -1 read as Python's kv[-1] lands) attend only to their valid indices; a row with none outputs 0."""
    case = _fitted(impl, case)
    if case is None:
        return
    res = run(impl, case, need=NEED)
    empty = ~oracle(case).visible.any(axis=-1)
    bad = empty & np.any(res.out != 0, axis=-1)
    expect(not bad.any(), "ATTN-SPARSE-2", f"{int(bad.sum())} row(s) with no valid index output non-zero values",
           case, impl)
    expect_close(res.out, case, impl, clause="ATTN-SPARSE-2")


@clauses("ATTN-SPARSE-1")
@for_cases(st.convention_cases(max_len=33), weight=0.4, needs=("sparse_indices",))
def test_order_and_duplicates_change_nothing(impl, case):
    """The same keys listed in another order and with some listed twice give the reference's output
    (and lse): a duplicate counts once."""
    case = _fitted(impl, case, sparse_duplicates=True)
    if case is None:
        return
    res = run(impl, case, need=NEED)
    expect_close(res.out, case, impl, clause="ATTN-SPARSE-1")
    if res.lse is not None:
        j = judge_lse(res.lse, case)
        judge(j, case, impl, "ATTN-SPARSE-1")


@clauses("ATTN-SPARSE-3")
@for_cases(st.convention_cases(max_len=33), weight=0.3, needs=("sparse_indices",))
def test_max_logits_is_the_largest_scaled_logit(impl, case):
    """max_logits is the largest scaled logit over the valid indices (-inf with none), within the
    float32 error of one dot product: 4 (Dk + 2) u32 (scale sum_d |q_d k_d| + |m|)."""
    case = _fitted(impl, case)
    if case is None:
        return
    res = run(impl, case, need=NEED)
    if res.notes.get("max_logits") is None:
        return
    got = np.asarray(res.notes["max_logits"], dtype=np.float64)
    f = oracle(case)
    want = reference_max_logits(f)
    empty = np.isneginf(want)
    expect(np.array_equal(np.isneginf(got), empty), "ATTN-SPARSE-3",
           "max_logits is -inf exactly where a row has no valid index, nowhere else", case, impl)
    s = case.shape
    q, k = case.q, np.repeat(case.k, s["Hq"] // s["Hkv"], axis=1)
    mag = case.effective_scale * np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(k))
    mag = np.where(f.visible, mag, 0.0).max(axis=-1, initial=0.0)
    bound = 4 * (s["Dk"] + 2) * U32 * (mag + np.abs(np.where(empty, 0.0, want)))
    with np.errstate(invalid="ignore"):
        err = np.where(empty, 0.0, np.abs(got - want))
    worst = int(np.argmax(err - bound)) if err.size else 0
    expect(bool(np.all(err <= bound)), "ATTN-SPARSE-3",
           f"max_logits off by {err.flat[worst]:.3g} > {bound.flat[worst]:.3g} (got {got.flat[worst]:.6g}, "
           f"the largest scaled logit is {want.flat[worst]:.6g})", case, impl)
