"""Variable-length packing (ATTN-VARLEN-1, -2): sequences in a pack are independent; empty ones are allowed.

Runs on implementations whose calling convention packs sequences (`varlen` in their scope,
the `flash_attn_varlen` convention); the others record these tests as unsupported. The pack
order is part of the case (packing["seq_order"]), so a kernel that confuses a sequence's
index with its place in the pack, or that sizes one sequence by another
(flash-attention#1192 used the global max_seqlen where a sequence's own length belonged),
is caught by the reference comparison, and one that lets sequences see each other by the
bitwise independence check.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, run
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import Case, oracle

PINNED_EMPTY = [
    # flash-attention#1537: an empty sequence next to max_seqlen_q == 1
    st.fixed_case(41, B=3, Hq=2, Lq=1, Lk=6, Dk=16, q_lengths=[1, 0, 1], kv_lengths=[3, 6, 0],
                  packing={"seq_order": [0, 1, 2]}),
    st.fixed_case(42, B=2, Hq=4, Hkv=2, Lq=9, Lk=5, Dk=8, q_lengths=[9, 4], kv_lengths=[0, 5],
                  causal="bottom_right", packing={"seq_order": [1, 0]}),
]


def _rows(case: Case, b: int) -> int:
    return int(case.q_lengths[b]) if case.q_lengths is not None else case.shape["Lq"]


@clauses("ATTN-VARLEN-1")
@for_cases(st.varlen_cases(), weight=0.4, needs=("varlen",))
def test_packed_sequences_are_independent(impl, case):
    """Redrawing one sequence's queries, keys and values (three times larger) leaves every other
    sequence's outputs and lse bitwise unchanged."""
    fitted = fit(case, impl, need={"varlen"})
    if fitted is None:
        run(impl, case, need={"varlen"})
        return
    case = fitted
    first = run(impl, case, need={"varlen"})
    expect_close(first.out, case, impl, clause="ATTN-VARLEN-1")
    rng = np.random.default_rng(case.seed + 9)
    b = int(rng.integers(case.shape["B"]))
    other = st.perturb_sequence(case, b, rng)
    second = run(impl, other, need={"varlen"})
    for s in range(case.shape["B"]):
        if s == b:
            continue
        n = _rows(case, s)
        same = np.array_equal(first.out[s, :, :n], second.out[s, :, :n], equal_nan=True)
        diff = max_gap(first.out[s, :, :n], second.out[s, :, :n])
        expect(same, "ATTN-VARLEN-1", f"sequence {s}'s output changed (max {diff:.3g}) when only sequence {b} "
               f"was redrawn", other, impl)
        if first.lse is not None and second.lse is not None:
            expect(np.array_equal(first.lse[s, :, :n], second.lse[s, :, :n], equal_nan=True), "ATTN-VARLEN-1",
                   f"sequence {s}'s lse changed when only sequence {b} was redrawn", other, impl)
    expect_close(second.out, other, impl, clause="ATTN-VARLEN-1")


@clauses("ATTN-VARLEN-2", "ATTN-EMPTY-1")
@for_cases(st.varlen_cases(empty=True), examples=PINNED_EMPTY, weight=0.3, needs=("varlen",))
def test_empty_sequences_in_a_pack(impl, case):
    """A pack with a sequence of no queries or no keys: everything agrees with the reference and
    the rows of a sequence with no keys are exactly 0."""
    fitted = fit(case, impl, need={"varlen"})
    if fitted is None:
        run(impl, case, need={"varlen"})
        return
    case = fitted
    res = run(impl, case, need={"varlen"})
    empty = ~oracle(case).visible.any(axis=-1)
    bad = np.argwhere(empty & ~(res.out == 0).all(axis=-1))
    if bad.size:
        first = tuple(int(i) for i in bad[0])
        expect(False, "ATTN-VARLEN-2", f"{len(bad)} rows that see no key are not exactly 0; first at {first}: "
               f"{res.out[first][:4]}", case, impl)
    if res.lse is not None:
        expect(bool(np.isneginf(res.lse[empty]).all()), "ATTN-VARLEN-2",
               "an empty row's lse is not the empty-row value", case, impl)
    expect_close(res.out, case, impl, clause="ATTN-VARLEN-2")
