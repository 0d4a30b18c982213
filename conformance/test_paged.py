"""The paged KV cache (ATTN-PAGED-1, -2, -3): block placement, page size, appended keys.

Runs on implementations whose convention has a paged cache or appends keys in place (`paged`,
`kvcache_append` in their scope: the `flash_attn_kvcache` convention); the others record
these tests as unsupported. The cache layout is part of the case (`packing`: page_size,
block_seed, spare_blocks, new_keys; adapters/conventions/flash_attn_kvcache.py), so each
property compares two layouts of one problem. Where appended keys land is checked by the
adapter after every call (a ConventionViolation of ATTN-PAGED-3).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.engine.harness import clauses, expect, expect_close, expect_equivalent, for_cases, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import Case


def _fit(case: Case, impl, need: set[str]) -> Case | None:
    fitted = fit(case, impl, need=need)
    if fitted is None or not all(fitted.packing.get(k) for k in ("page_size",) if "paged" in need):
        run(impl, case, need=need)                # recorded as unsupported, with its reason
        return None
    return fitted


@clauses("ATTN-PAGED-1")
@for_cases(st.paged_cases(), weight=0.3, needs=("paged|kvcache_append",))
def test_block_placement_does_not_matter(impl, case):
    """Another permutation of the physical blocks (block table and storage together) gives the
    bitwise same output and lse."""
    case = _fit(case, impl, {"paged"})
    if case is None:
        return
    first = run(impl, case, need={"paged"})
    moved = case.replace(packing={**case.packing, "block_seed": (case.packing.get("block_seed", 0) + 7919) % 2**31,
                                  "spare_blocks": case.packing.get("spare_blocks", 0) + 2})
    second = run(impl, moved, need={"paged"})
    diff = max_gap(first.out, second.out)
    expect(np.array_equal(first.out, second.out, equal_nan=True), "ATTN-PAGED-1",
           f"moving the blocks to other physical places changed the output (max {diff:.3g})", moved, impl)
    if first.lse is not None and second.lse is not None:
        expect(np.array_equal(first.lse, second.lse, equal_nan=True), "ATTN-PAGED-1",
               "moving the blocks to other physical places changed the lse", moved, impl)
    expect_close(first.out, case, impl, clause="ATTN-PAGED-1")


@clauses("ATTN-PAGED-2")
@for_cases(st.paged_cases(), weight=0.3, needs=("paged|kvcache_append",))
def test_paged_equals_contiguous(impl, case):
    """The same keys in pages of the drawn size and in a contiguous cache give the same output
    (each within its tolerance, and the two within both allowances)."""
    case = _fit(case, impl, {"paged"})
    if case is None:
        return
    contiguous = case.replace(packing={**case.packing, "page_size": 0})
    expect_equivalent(impl, case, contiguous, clause="ATTN-PAGED-2", what="paged vs contiguous cache")


@clauses("ATTN-PAGED-3", "ATTN-OP-1")
@for_cases(st.paged_cases(append=True), weight=0.3, needs=("paged|kvcache_append",))
def test_appended_keys_land_and_are_attended(impl, case):
    """Keys appended in the call are written at cache_seqlens (the adapter checks the cache bitwise,
    ATTN-PAGED-3) and attended to (the output agrees with the reference over all the keys)."""
    need = {"kvcache_append"}
    fitted = fit(case, impl, need=need)
    if fitted is None or not fitted.packing.get("new_keys"):
        run(impl, case, need=need)
        return
    res = run(impl, fitted, need=need)
    expect_close(res.out, fitted, impl, clause="ATTN-PAGED-3")
