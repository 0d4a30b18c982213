"""Memory the kernel must not read stays unread (ATTN-MEM-1).

The calling conventions (adapters/conventions/) fill every buffer position a kernel must not read with
NaN: cache slots at or past cache_seqlens and unused pages (flash_attn_kvcache), padding rows past
cu_seqlens_k[-1] (flash_attn_varlen), the memory right after a K/V tensor (flashinfer_*). A kernel that
reads one and gives it weight 0 returns NaN where the reference is finite. Every test that judges an
output catches that as ATTN-TOL-3; this one draws the cases where such memory exists (caches with spare
slots and pages, packed batches, decode) and names the clause. For a convention without unread buffers
(SDPA) it passes by construction, as it must.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import hypothesis.strategies as hst
import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import oracle


@clauses("ATTN-MEM-1")
@for_cases(hst.one_of(st.paged_cases(), st.varlen_cases(), st.convention_cases(max_len=65)), weight=0.3)
def test_unread_memory_does_not_reach_the_output(impl, case):
    """No NaN or inf in the output where the reference is finite, with NaN in every unread position."""
    fitted = fit(case, impl)
    if fitted is None:
        run(impl, case)                                  # recorded as unsupported, with its reason
        return
    res = run(impl, fitted)
    ref = oracle(fitted).out
    bad = np.isfinite(ref) & ~np.isfinite(np.asarray(res.out))
    where = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None
    expect(not bad.any(), "ATTN-MEM-1", f"{int(bad.sum())} output value(s) non-finite where the reference is finite "
           f"(first at {where}): the kernel read memory it must not (NaN there), even if it weighted it 0", fitted, impl)
    expect_close(res.out, fitted, impl, clause="ATTN-MEM-1")
