"""A paged batch reads exactly its pages (ATTN-PAGED-4): any page size, the last partial page, NHD and HND.

Runs where an implementation reads a paged cache through a page table with a last-page length
(`paged` in its scope; the `flashinfer_batch_prefill` and `flashinfer_batch_decode` conventions,
adapters/conventions/flashinfer_paged.py; other paged conventions record the page sizes they cannot
take as unsupported). Page sizes are drawn around 16 and away from it (1, 3, 7, 16, 17, 31), with
lengths that leave the last page partial; every slot outside a request's keys holds finite values
that would move the result if read (the tail of the last page, spare pages, the next request's pages).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import hypothesis.strategies as hst
import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import Case

NEED = {"paged"}
PAGE_SIZES = (1, 3, 7, 16, 17, 31)


@hst.composite
def small_page_cases(draw, *, decode: bool) -> Case:
    """A paged case with a small page size, a layout, and ragged key lengths (one query per request if `decode`)."""
    case = draw(st.paged_cases(append=False))
    if decode:
        case = case.replace(q=np.ascontiguousarray(case.q[:, :, -1:]), causal=None)
    s = case.shape
    rng = np.random.default_rng(case.seed + 11)
    kl = rng.integers(1, s["Lk"] + 1, size=s["B"])
    kl[rng.integers(s["B"])] = s["Lk"]
    return case.replace(kv_lengths=kl, packing={**case.packing, "page_size": draw(hst.sampled_from(PAGE_SIZES)),
                                                "kv_layout": draw(hst.sampled_from(("NHD", "HND")))})


def _check(impl, case: Case) -> None:
    fitted = fit(case, impl, need=NEED)
    if fitted is None:
        run(impl, case, need=NEED)
        return
    res = run(impl, fitted, need=NEED)
    expect_close(res.out, fitted, impl, clause="ATTN-PAGED-4")


@clauses("ATTN-PAGED-4")
@for_cases(small_page_cases(decode=False), weight=0.4, needs=("paged",))
def test_pages_of_any_size_with_a_partial_last_page(impl, case):
    """Prefill-shaped batches: each request's keys through its pages, of a drawn size, in a drawn layout."""
    _check(impl, case)


@clauses("ATTN-PAGED-4")
@for_cases(small_page_cases(decode=True), weight=0.4, needs=("paged",))
def test_decode_pages_of_any_size_with_a_partial_last_page(impl, case):
    """One query per request (decode), the same paged reads."""
    _check(impl, case)
