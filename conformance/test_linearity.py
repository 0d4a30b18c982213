"""Attention is a convex, linear map of V (ATTN-PROP-9, -10, -11), with and without sinks.

For fixed Q, K and masks the output row i is sum_j P[i,j] V[j] with P[i, :] a
probability vector over the visible keys. Three consequences hold for every
correct kernel and are broken by typical defects: linearity in V (a kernel that
normalises or clamps V breaks it), the convex hull (a denominator that counts
masked keys, or a missing max-subtraction, pushes rows outside the range of
their values) and uniform weights for identical keys (the row is the plain mean).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.nan_aware import gap, max_abs, max_gap
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, run
from attnconf.reference import expand_kv, oracle
from attnconf.conformance.engine.tolerance import ulp

EPS64 = np.finfo(np.float64).eps
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -24, "bfloat16": 2.0 ** -24}
COMBINATIONS = ((1.0, 1.0), (2.0, -1.0), (0.5, 0.25), (-1.0, 3.0), (0.75, -1.5))


@clauses("ATTN-PROP-9")
@for_cases(st.cases(max_len=65, layouts=False, sinks=True), weight=0.3)
def test_linear_in_values(impl, case):
    """attn(Q, K, a V1 + b V2) = a attn(Q, K, V1) + b attn(Q, K, V2): each run is judged against its
    own reference, and the combination within the sum of the three allowances."""
    rng = np.random.default_rng(case.seed)
    a, b = COMBINATIONS[int(rng.integers(len(COMBINATIONS)))]
    c2 = case.replace(v=rng.normal(size=case.v.shape) * np.abs(case.v).max(initial=1.0))
    c3 = case.replace(v=a * case.v + b * c2.v)        # re-rounded to the dtype: its own reference says how
    runs = [run(impl, c) for c in (case, c2, c3)]
    js = [expect_close(r.out, c, impl, clause="ATTN-PROP-9") for r, c in zip(runs, (case, c2, c3))]
    o1, o2, o3 = (r.out for r in runs)
    combo = a * o1 + b * o2
    ref_gap = gap(oracle(c3).out, a * oracle(case).out + b * oracle(c2).out)
    allowed = (js[2].allowed_max + abs(a) * js[0].allowed_max + abs(b) * js[1].allowed_max
               + max_abs(ref_gap) + 4 * EPS64 * max_abs(combo))
    d = max_gap(o3, combo)
    expect(d <= allowed, "ATTN-PROP-9", f"attn(a V1 + b V2) differs from a attn(V1) + b attn(V2) by {d:.3g} "
           f"(a={a:g}, b={b:g}; allowed {allowed:.3g})", c3, impl)


def hull_slack(m: np.ndarray, dtype: str, lk: int) -> np.ndarray:
    """How far outside [min, max] of the visible values a correct kernel's entry may land.

    Weights are non-negative and sum to 1 + delta with |delta| <= (Lk + 1) u (the normaliser is a
    sum of Lk terms plus one division, in accumulation precision u: float32 for every dtype below
    float64); the weighted sum adds at most Lk u sum_j P_j |V_j| <= Lk u M, with M the largest visible
    |V| of the column. So before the final rounding the entry is within gamma_{2Lk+2} M of the
    range. Rounding to the dtype is monotone and the range ends are representable, so the final
    rounding adds at most one ulp at M; rounding P to the dtype before P V (flash kernels) adds at
    most u_t M <= one more ulp. Hence 2 ulp_t(M) + gamma_{2Lk+2}(u) M.
    """
    u = UNIT_ROUNDOFF[dtype]
    n = 2 * lk + 2
    return 2.0 * ulp(m, dtype) + (n * u / (1 - n * u)) * m


@clauses("ATTN-PROP-10")
@for_cases(st.cases(max_len=129, sinks=True), weight=0.4)
def test_output_in_convex_hull(impl, case):
    """Each output entry lies within the per-column [min, max] of the visible V rows (up to a few
    ulps, hull_slack); rows that see no key are left to ATTN-EMPTY-1. With sinks the range includes 0: the
    sink's share of a row carries no value."""
    rng = np.random.default_rng(case.seed)
    if rng.random() < 0.5:       # values >= 1: a row whose weights sum to less than 1 leaves the hull
        case = case.replace(v=case.v - case.v.min(initial=0.0) + 1.0)
    res = run(impl, case)
    vis = oracle(case).visible[..., None]                               # (B, H, Lq, Lk, 1)
    ve = expand_kv(case.v, case.shape["Hq"])[:, :, None]                # (B, H, 1, Lk, Dv)
    lo = np.where(vis, ve, np.inf).min(axis=-2, initial=np.inf)
    hi = np.where(vis, ve, -np.inf).max(axis=-2, initial=-np.inf)
    if case.sinks is not None:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    rows = vis[..., 0].any(axis=-1)
    m = np.maximum(np.abs(np.where(rows[..., None], lo, 0.0)), np.abs(np.where(rows[..., None], hi, 0.0)))
    slack = hull_slack(m, case.dtype, case.shape["Lk"])
    out = res.out
    inside = (out >= lo - slack) & (out <= hi + slack)
    bad = np.argwhere(rows[..., None] & ~inside)
    if bad.size:
        i = tuple(int(x) for x in bad[0])
        expect(False, "ATTN-PROP-10", f"{len(bad)} output entries outside the range of their visible values; first "
               f"at {i}: {out[i]:.9g} not in [{lo[i]:.9g}, {hi[i]:.9g}] +- {slack[i]:.3g}", case, impl)


@clauses("ATTN-PROP-11", "ATTN-W-1")
@for_cases(st.identical_key_cases(sinks=True), weight=0.3)
def test_identical_keys_give_the_mean(impl, case):
    """When every visible key of a row is the same vector the weights are uniform and the row is the
    mean of its visible V rows (the reference of this case), within tolerance; with sinks, that mean
    times 1 - the sink's share of the row."""
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-PROP-11")
