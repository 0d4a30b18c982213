"""Causal rows never read the future, bitwise (ATTN-CAUSAL-2), and causally empty rows are 0 (ATTN-CAUSAL-3).

A correct kernel gives an invisible key the exact weight 0, and adding exact
zeros changes no float, so changing what row i cannot see (keys, values, mask
and bias entries past a cutoff) must leave row i's bits as they were. The
rows checked are those that see no position past the cutoff in either the
original or the perturbed case (reference visibility), so the check needs no
knowledge of the alignment beyond the spec's. Bits are asked of every such row:
reruns on the same input are bitwise identical (ATTN-DET-1; ATTN-OP-7 records it),
so a row that moves read the future or is nondeterministic, and either is a
failure. Only a kernel that declares `deterministic = false` is excused the bits:
its rows move on their own, and a rerun that happens to agree does not show that
a row is stable (measured: tests.kernels.determinism_bugs' declared control moved
a row that its rerun had repeated), so both of its runs are judged against the
references of their own cases (ATTN-TOL-1) instead.
Signed zeros compare equal: ATTN-EMPTY-1 allows either sign.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters import Adapter
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, observe, run
from attnconf.conformance.engine.nan_aware import max_abs
from attnconf.reference import Case, causal_visible, oracle

KEY = "forward_bitwise_deterministic"       # the ATTN-OP-7 observation
PINNED = [
    st.fixed_case(21, Lq=7, Lk=7, causal="top_left"),
    st.fixed_case(22, B=2, Hq=4, Hkv=2, Lq=17, Lk=5, Dk=8, causal="bottom_right"),
    st.fixed_case(23, Lq=5, Lk=13, causal="bottom_right", dtype="bfloat16",
                  mask=np.random.default_rng(0).random((5, 13)) < 0.8),
    st.fixed_case(24, B=2, Lq=9, Lk=9, causal="top_left", dtype="float16", kv_lengths=[9, 4],
                  bias=np.random.default_rng(1).normal(size=(9, 9))),
]
TALL = [
    st.fixed_case(25, Lq=9, Lk=4, Dk=16, causal="bottom_right"),
    st.fixed_case(26, B=2, Hq=2, Hkv=1, Lq=33, Lk=1, Dk=8, causal="bottom_right", dtype="float16"),
]


def perturb_future(case: Case, cut: int, rng: np.random.Generator) -> Case:
    """The case with keys, values, mask and bias columns j >= cut changed (same shapes, same magnitudes)."""
    k, v = case.k.copy(), case.v.copy()
    k[:, :, cut:] = -k[:, :, cut:][:, :, ::-1]
    v[:, :, cut:] = rng.normal(size=v[:, :, cut:].shape)
    if case.layout == "broadcast_kv":
        k[:], v[:] = k[:1], v[:1]
    changes: dict = {"k": k, "v": v}
    lk = case.shape["Lk"]
    if case.mask is not None and case.mask.shape[-1] == lk:
        m = case.mask.copy()
        m[..., cut:] = rng.random(m[..., cut:].shape) < 0.5
        changes["mask"] = m
    if case.bias is not None and case.bias.shape[-1] == lk:
        b = case.bias.copy()
        tail = rng.normal(size=b[..., cut:].shape) * 3.0
        tail[rng.random(tail.shape) < 0.2] = -np.inf
        b[..., cut:] = tail
        changes["bias"] = b
    return case.replace(**changes)


def cutoff(case: Case, rng: np.random.Generator) -> int:
    """A key position such that, without padding, some row sees keys only before it (0 if Lk = 1)."""
    lq, lk = case.shape["Lq"], case.shape["Lk"]
    lo = 1 + max(0, lk - lq) if case.causal == "bottom_right" else 1
    if lo >= lk:
        lo = 1
    return int(rng.integers(lo, lk)) if lk > 1 else 0


def rerun(impl: Adapter, case: Case, first: np.ndarray) -> np.ndarray:
    """(B, Hq, Lq): the rows a second run on the same input gives bitwise again (ATTN-OP-7 records whether
    all do)."""
    again = run(impl, case)
    again_out = again.notes.get("raw_out", again.out)
    stable = ((first == again_out) | (np.isnan(first) & np.isnan(again_out))).all(axis=-1)
    same = bool(stable.all())
    seen = [o for o in impl.record.observations if o["key"] == KEY]
    if not same or not seen:                     # one row per test, plus every case that was not deterministic
        observe(impl, "ATTN-OP-7", KEY, same, case)
    return stable


@clauses("ATTN-CAUSAL-2", "ATTN-OP-7")
@for_cases(st.causal_cases(max_len=65), examples=PINNED + TALL[:1], weight=0.5)
def test_future_does_not_leak(impl, case):
    """Rows that cannot see past a cutoff are bitwise unchanged when everything past it changes."""
    rng = np.random.default_rng(case.seed)
    cut = cutoff(case, rng)
    res = run(impl, case)
    # an approximate kernel's contract (SPEC section 29) exempts its values, never its causality: raw outputs
    stable = rerun(impl, case, res.notes.get("raw_out", res.out))
    moved = perturb_future(case, cut, rng)
    res2 = run(impl, moved)
    sees_future = oracle(case).visible[..., cut:].any(axis=-1) | oracle(moved).visible[..., cut:].any(axis=-1)
    if not impl.deterministic:          # declared nondeterministic: its bits move on their own (ATTN-DET-1)
        expect_close(res.out, case, impl, clause="ATTN-CAUSAL-2")
        expect_close(res2.out, moved, impl, clause="ATTN-CAUSAL-2")
        return
    rows = ~sees_future                                       # (B, Hq, Lq)
    a, b = res.notes.get("raw_out", res.out)[rows], res2.notes.get("raw_out", res2.out)[rows]
    changed = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    if changed.any():
        where = np.argwhere(rows)[int(np.argwhere(changed)[0][0])]
        r = tuple(int(i) for i in where)
        why = "" if stable[tuple(where)] else (
            "; its rerun on the same input already differed (ATTN-DET-1: a kernel whose reruns differ declares "
            "deterministic = false)")
        expect(False, "ATTN-CAUSAL-2", f"row {r} (sees no key >= {cut}) changed when keys/values/mask/bias "
               f">= {cut} changed: {int(changed.any(axis=-1).sum())} of {int(rows.sum())} such rows differ, "
               f"max |diff| {np.abs(a - b)[changed].max():.3g}{why}", case, impl)


@clauses("ATTN-CAUSAL-3", "ATTN-EMPTY-1")
@for_cases(st.causal_cases(max_len=65, tall=True), examples=TALL, weight=0.25)
def test_bottom_right_empty_rows(impl, case):
    """With bottom_right and Lq > Lk, the rows that see no key (the first Lq - Lk) output exactly 0."""
    res = run(impl, case)
    s = case.shape
    for b in range(s["B"]):
        ql = None if case.q_lengths is None else int(case.q_lengths[b])
        kl = None if case.kv_lengths is None else int(case.kv_lengths[b])
        empty = ~causal_visible(s["Lq"], s["Lk"], "bottom_right", ql, kl).any(axis=-1)
        rows = res.out[b][:, empty]
        expect(bool((rows == 0).all()), "ATTN-CAUSAL-3",
               f"batch {b}: {int(empty.sum())} causally empty row(s) (first {int(np.argmax(empty))}) are not 0: "
               f"max |out| {max_abs(rows):.3g}, NaN: {bool(np.isnan(rows).any())}",
               case, impl)
    expect_close(res.out, case, impl, clause="ATTN-CAUSAL-3")
