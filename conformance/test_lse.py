"""The log-sum-exp (ATTN-LSE-1..4): natural log, the empty row's value, the shape, and the merge.

Split-KV decoding and context parallelism compute attention over chunks of the keys and combine them
by their lse; a kernel whose lse is in base 2 (FlashInfer, flashinfer-ai/flashinfer#2113), off by ln 2
(pytorch/pytorch#181645), +inf on an empty row, or missing a sink's term gives right outputs and a
wrong merge. So besides comparing the lse with the reference, the suite splits a case's keys at random
cut points (empty chunks included), runs the kernel on each chunk, merges with `merge_partials`, and
requires the whole case's reference within the error the chunks' own allowances propagate to (SPEC
section 23).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as hst

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, for_cases, judge, run
from attnconf.conformance.engine.tolerance import judge_lse, judge_output
from attnconf.reference import Case, merge_partials, oracle


@clauses("ATTN-LSE-1", "ATTN-LSE-3", "ATTN-SINK-2", "ATTN-ALIBI-2")
@for_cases(st.variant_cases(max_len=65), weight=0.5, needs=("lse",))
def test_lse_matches_reference(impl, case):
    """With windows, softcap, ALiBi and sinks the kernel's lse has shape (B, Hq, Lq) and is the natural log of
    the row's softmax denominator (the sink's term and ALiBi's row constant included)."""
    res = run(impl, case, need={"lse"})
    expect(res.lse is not None and res.lse.shape == case.out_shape[:3], "ATTN-LSE-3",
           f"lse shape {None if res.lse is None else res.lse.shape} != (B, Hq, Lq) = {case.out_shape[:3]}", case, impl)
    judge(judge_lse(res.lse, case), case, impl, "ATTN-LSE-1")


def _uniform_case(n: int, dtype: str, **params) -> Case:
    """Q = 0 over n keys: every logit is 0, so lse = ln n exactly (ln 2 = 0.693 where base 2 gives 1)."""
    rng = np.random.default_rng(n)
    return Case.build(np.zeros((2, 2, 3, 8)), rng.normal(size=(2, 1, n, 8)), rng.normal(size=(2, 1, n, 8)),
                      dtype=dtype, seed=n, **params)


LN_PROBES = [_uniform_case(2, "float32"), _uniform_case(3, "bfloat16"), _uniform_case(8, "float16"),
             _uniform_case(100, "float64"), _uniform_case(5, "float32", kv_lengths=np.array([0, 2])),
             _uniform_case(4, "float32", sinks=np.array([0.0, math.log(4)]))]


@clauses("ATTN-LSE-1", "ATTN-LSE-2", "ATTN-SINK-3")
@for_cases(st.fixed_cases(LN_PROBES), examples=LN_PROBES, weight=0.1, dtypes=None, needs=("lse",))
def test_lse_is_the_natural_log(impl, case):
    """Q = 0 over n visible keys gives lse = ln n exactly (ln n + the sink's share with a sink; -inf over no key):
    a base-2 statistic (log2 n) or one scaled by ln 2 is told apart and named."""
    res = run(impl, case, need={"lse"})
    ref = oracle(case).lse
    j = judge_lse(res.lse, case)
    if not j.ok:
        fin = np.isfinite(ref) & np.isfinite(res.lse) & (ref != 0)
        ratio = float(np.median(res.lse[fin] / ref[fin])) if fin.any() else float("nan")
        hint = {round(1 / math.log(2), 3): "base 2 (log2 of the denominator)", round(math.log(2), 3): "natural log times ln 2"}
        expect(False, "ATTN-LSE-1", f"lse {res.lse.ravel()[:3]} where ln of the denominator is {ref.ravel()[:3]}; "
               f"ratio {ratio:.4g}: {hint.get(round(ratio, 3), 'not the natural log')}", case, impl)
    judge(j, case, impl, "ATTN-LSE-1")


def chunk(case: Case, lo: int, hi: int) -> Case | None:
    """The case restricted to keys [lo, hi) (ATTN-LSE-4), without its sinks (the merge adds them as a chunk).

    Where visibility depends on positions (causal, window, ALiBi) or a mask already exists, the other keys
    are masked and positions stay; otherwise K and V are sliced, so kernels without masks can be merged too.
    None for an empty slice: its (0, -inf) is known without running anything."""
    s = case.shape
    positional = case.causal is not None or case.window is not None or case.alibi_slopes is not None
    if positional or case.mask is not None:
        keep = (np.arange(s["Lk"]) >= lo) & (np.arange(s["Lk"]) < hi)
        mask = keep[None, None, None, :] if case.mask is None else np.logical_and(case.mask, keep)
        return case.replace(mask=mask, sinks=None, grad_out=None)
    if hi == lo:
        return None
    bias = case.bias
    if bias is not None and bias.shape[-1] != 1:
        bias = bias[..., lo:hi]
    kv = None if case.kv_lengths is None else np.clip(case.kv_lengths - lo, 0, hi - lo)
    return case.replace(k=case.k[:, :, lo:hi], v=case.v[:, :, lo:hi], bias=bias, kv_lengths=kv, sinks=None,
                        grad_out=None, layout="contiguous")


@clauses("ATTN-LSE-4", "ATTN-LSE-5", "ATTN-LSE-2", "ATTN-SINK-2")
@for_cases(hst.one_of(st.cases(max_len=65, layouts=False), st.variant_cases(max_len=65)), weight=0.6, needs=("lse",))
def test_merging_chunks_by_lse_gives_the_whole(impl, case):
    """Keys cut at 1 to 4 random points (empty chunks allowed), the kernel run on each chunk, outputs merged by
    their lse (a sink as one more chunk: out 0, lse = sink): the merge equals the whole case's reference within
    the error the chunks' allowances propagate to, and so does the merged lse."""
    s = case.shape
    rng = np.random.default_rng(case.seed)
    cuts = np.sort(rng.integers(0, s["Lk"] + 1, size=int(rng.integers(1, 5))))
    bounds = [int(x) for x in np.r_[0, cuts, s["Lk"]]]
    outs, lses, refs, a, b, chunks = [], [], [], [], [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = chunk(case, lo, hi)
        if part is None:
            continue
        res = run(impl, part, need={"lse"})
        expect(res.lse is not None and res.lse.shape == case.out_shape[:3], "ATTN-LSE-3",
               f"chunk lse shape {None if res.lse is None else res.lse.shape} != {case.out_shape[:3]}", part, impl)
        ref = oracle(part)
        jo, jl = judge_output(res.out, part), judge_lse(res.lse, part)
        outs.append(res.out), lses.append(res.lse), refs.append((ref.out, ref.lse))
        a.append(jo.allowed_max), b.append(jl.allowed_max), chunks.append((part, jo, jl))
    if case.sinks is not None:
        sink = np.broadcast_to(case.sinks[None, :, None], case.out_shape[:3])
        zero = np.zeros(case.out_shape)
        outs.append(zero), lses.append(sink), refs.append((zero, sink)), a.append(0.0), b.append(0.0)
    if not outs:
        return
    with np.errstate(all="ignore"):
        out, lse = merge_partials(outs, lses)
        ref_out, ref_lse = merge_partials([r[0] for r in refs], [r[1] for r in refs])
    whole = oracle(case)
    # the propagated allowance of SPEC section 23, elementwise, around the reference weights; an lse
    # allowance beyond ~600 (bfloat16 with |lse| ~ 1e5) leaves the weights unconstrained: the exponent is
    # capped there (a finite, astronomically large allowance; inf * 0 would be NaN)
    bstar = max(b)
    with np.errstate(all="ignore"):
        w = [np.where(np.isneginf(r[1]), 0.0, np.exp(r[1] - np.where(np.isneginf(ref_lse), 0.0, ref_lse))) for r in refs]
        allowed = sum(wc[..., None] * (math.expm1(min(bc + bstar, 600.0)) * np.abs(rc[0] - ref_out) + math.exp(min(bc + bstar, 600.0)) * ac)
                      for wc, rc, ac, bc in zip(w, refs, a, b))
    gap = float(np.abs(ref_out - whole.out).max(initial=0.0))
    err = np.abs(out - whole.out)
    bad = np.argwhere(~(err <= allowed + gap))
    if bad.size:
        i = tuple(int(x) for x in bad[0])
        expect(False, "ATTN-LSE-4", f"merging {len(outs)} chunks (cuts {bounds}) by their lse gives {out[i]:.6g} at {i}, "
               f"the whole case's reference is {whole.out[i]:.6g} (error {err[i]:.3g} > propagated allowance "
               f"{allowed[i] + gap:.3g}); chunk lse {[float(x[i[:3]]) for x in lses]} vs reference "
               f"{[float(r[1][i[:3]]) for r in refs]}", case, impl)
    fin = np.isfinite(whole.lse)
    expect(bool(np.array_equal(np.isneginf(lse), np.isneginf(whole.lse))), "ATTN-LSE-2",
           "the merged lse is -inf on other rows than the whole case's", case, impl)
    dl = float(np.abs(lse[fin] - whole.lse[fin]).max(initial=0.0))
    gap_l = float(np.abs(ref_lse[fin] - whole.lse[fin]).max(initial=0.0))
    expect(dl <= bstar + gap_l, "ATTN-LSE-5", f"merged lse off by {dl:.3g} > {bstar + gap_l:.3g}", case, impl)
    for part, jo, jl in chunks:          # and each chunk on its own
        judge(jo, part, impl)
        judge(jl, part, impl, "ATTN-LSE-1")
