"""The log-sum-exp a kernel returns (ATTN-LSE-1, -2, -3): natural log, shape, empty rows, and merging.

Each calling convention returns its lse in its own terms: flash-attention (B, H, Lq) or
(H, total_q), natural log, +inf for a row that sees no key; FlashInfer [qo_len, H], base 2,
-inf. The adapters convert to the spec's (B, Hq, Lq), natural log, -inf, and raise a
ConventionViolation (ATTN-LSE-2) for any other non-finite value. These tests run wherever an
implementation returns the lse (`lse` in its scope).

The merge property (ATTN-LSE-4) is what context-parallel and split-KV code relies on: run the
kernel on chunks of the keys, merge by lse, and the whole must come out. A kernel whose lse is
in the wrong base (FlashInfer's base 2 read as natural, torch flex's ln 2 error) fails it.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, judge, run
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_lse, judge_output
from attnconf.reference import Case, oracle

PINNED_EMPTY = [st.fixed_case(51, B=2, Hq=2, Lq=9, Lk=4, Dk=16, causal="bottom_right"),
                st.fixed_case(52, B=1, Hq=2, Lq=6, Lk=6, Dk=8, window=(0, 0), window_align="bottom_right",
                              kv_lengths=[2], dtype="float16")]


def _fitted(impl, case: Case) -> Case | None:
    fitted = fit(case, impl, need={"lse"})
    if fitted is None:
        run(impl, case, need={"lse"})
    return fitted


def base_hint(lse: np.ndarray, ref: np.ndarray) -> str:
    """Which base the kernel's lse looks like, for the failure message."""
    ok = np.isfinite(lse) & np.isfinite(ref) & (np.abs(ref) > 1e-3)
    if not ok.any():
        return ""
    ratio = float(np.median(lse[ok] / ref[ok]))
    for name, r in (("base 2 (lse / ln 2)", 1 / np.log(2)), ("ln 2 too small (lse * ln 2)", np.log(2)),
                    ("base 10", 1 / np.log(10))):
        if abs(ratio - r) < 0.02 * r:
            return f"; it looks like {name}: median ratio to the natural lse {ratio:.4f}"
    return ""


@clauses("ATTN-LSE-1", "ATTN-W-3")
@for_cases(st.lse_cases(), weight=0.5, needs=("lse",))
def test_lse_is_natural_log_per_row(impl, case):
    """The returned lse, converted by the convention's rule, is the natural log of each row's
    softmax denominator, one value per (batch, head, query)."""
    case = _fitted(impl, case)
    if case is None:
        return
    res = run(impl, case, need={"lse"})
    expect(res.lse is not None and res.lse.shape == case.out_shape[:3], "ATTN-LSE-1",
           f"lse shape {None if res.lse is None else res.lse.shape} != {case.out_shape[:3]}", case, impl)
    j = judge_lse(res.lse, case)
    if not j.ok:
        j.reason = f"[ATTN-LSE-1] {j.explain().split('] ', 1)[-1]}{base_hint(res.lse, oracle(case).lse)}"
    judge(j, case, impl)


@clauses("ATTN-LSE-2", "ATTN-EMPTY-1", "ATTN-EMPTY-2")
@for_cases(st.lse_empty_cases(), examples=PINNED_EMPTY, weight=0.3, needs=("lse",))
def test_lse_of_rows_that_see_no_key(impl, case):
    """Rows that see no key (bottom-right causal with Lq > Lk, a window past the keys, a sequence
    with no keys) output 0 and return the convention's empty-row lse (the spec's -inf after mapping)."""
    case = _fitted(impl, case)
    if case is None:
        return
    empty = ~oracle(case).visible.any(axis=-1)
    res = run(impl, case, need={"lse"})
    if not empty.any():
        return
    bad = np.argwhere(empty & ~(res.out == 0).all(axis=-1))
    if bad.size:
        first = tuple(int(i) for i in bad[0])
        expect(False, "ATTN-EMPTY-1", f"{len(bad)} rows that see no key are not exactly 0; first at {first}",
               case, impl)
    lbad = np.argwhere(empty & ~np.isneginf(res.lse))
    if lbad.size:
        first = tuple(int(i) for i in lbad[0])
        expect(False, "ATTN-LSE-2", f"the lse of row {first}, which sees no key, is {res.lse[first]} after the "
               f"convention's mapping, not -inf", case, impl)
    judge(judge_lse(res.lse, case), case, impl)


def chunks(case: Case, rng: np.random.Generator) -> list[tuple[int, int]]:
    lk = case.shape["Lk"]
    n = int(rng.integers(2, min(4, lk) + 1))
    cuts = sorted(rng.choice(np.arange(1, lk), size=n - 1, replace=False).tolist())
    edges = [0, *cuts, lk]
    return list(zip(edges, edges[1:]))


def key_chunk(case: Case, lo: int, hi: int) -> Case:
    return case.replace(k=case.k[:, :, lo:hi], v=case.v[:, :, lo:hi], kv_lengths=None, grad_out=None)


@clauses("ATTN-LSE-4", "ATTN-LSE-5")
@for_cases(st.lse_merge_cases(), weight=0.4, needs=("lse",))
def test_lse_merges_key_chunks(impl, case):
    """Chunks of the keys, merged by their lse (O = sum_c exp(lse_c - lse) O_c), equal the whole; the
    bound comes from the chunks' own allowances (SPEC.md ATTN-LSE-4)."""
    case = _fitted(impl, case)
    if case is None or case.causal is not None or case.window is not None or case.alibi_slopes is not None \
            or case.kv_lengths is not None or case.shape["Lk"] < 2 or case.dropout_p:
        return
    parts = []
    for lo, hi in chunks(case, np.random.default_rng(case.seed + 13)):
        sub = key_chunk(case, lo, hi)
        res = run(impl, sub, need={"lse"})
        parts.append((sub, res))
    whole = run(impl, case, need={"lse"})
    lses = np.stack([r.lse for _, r in parts])                     # (C, B, H, Lq)
    outs = np.stack([r.out for _, r in parts])                     # (C, B, H, Lq, Dv)
    with np.errstate(all="ignore"):
        m = lses.max(axis=0)
        lse = m + np.log(np.exp(lses - m).sum(axis=0))
        merged = (np.exp(lses - lse)[..., None] * outs).sum(axis=0)
    empty = np.isneginf(m)                  # a row no chunk gives a key (a padded query): the spec's 0 and -inf
    lse, merged = np.where(empty, -np.inf, lse), np.where(empty[..., None], 0.0, merged)
    a = max(judge_output(r.out, sub).allowed_max for sub, r in parts)
    l_allow = max(judge_lse(r.lse, sub).allowed_max for sub, r in parts)
    # plus the float64 rounding of the merge itself (all that is left where a contract exempts every element)
    bound = a + np.expm1(2 * l_allow) * float(np.abs(outs).max(initial=0.0)) \
        + len(parts) * float(np.finfo(np.float64).eps) * (4 + 2 * float(np.max(np.abs(np.where(
            np.isfinite(lses), lses, 0.0)), initial=0.0))) * float(np.abs(outs).max(initial=0.0))
    j_whole = judge_output(whole.out, case)
    gap = max_gap(merged, whole.out)
    expect(gap <= bound + j_whole.allowed_max, "ATTN-LSE-4",
           f"merging {len(parts)} key chunks by their lse gives an output {gap:.3g} away from the whole-key output "
           f"(allowed {bound:.3g} + {j_whole.allowed_max:.3g})"
           f"{base_hint(np.stack([r.lse for _, r in parts]), np.stack([oracle(s).lse for s, _ in parts]))}",
           case, impl)
    ref = oracle(case)
    lgap = max_gap(lse, ref.lse)
    l_allow += 4 * len(parts) * float(np.finfo(np.float64).eps) * max(1.0, float(np.max(np.abs(np.where(
        np.isfinite(ref.lse), ref.lse, 0.0)), initial=0.0)))
    expect(lgap <= l_allow, "ATTN-LSE-5", f"the merged lse is {lgap:.3g} from the reference (allowed {l_allow:.3g})",
           case, impl)
    for sub, r in parts:
        expect_close(r.out, sub, impl, clause="ATTN-LSE-4")
