"""The scale: its default, its homogeneity, shift invariance, and why 1/sqrt(Dk) (ATTN-OP-4, ATTN-PROP-4, -6, -8).

A wrong scale is the quietest attention bug: outputs stay finite, rows still
sum to 1, and only the sharpness of the weights changes. So the scale a kernel
actually applied is recovered from its own output. With two keys and V rows
e_0, e_1, out[i, 0] = sigmoid(s * q_i.(k0 - k1)), so s_eff = logit(out[i, 0]) / q_i.(k0 - k1).
The tolerance on s_eff is not a separate number: the tolerance model allows
out[i, 0] within +-a of the reference, and logit maps that interval onto the
interval of scales a correct kernel may show. Its width is a / (o (1 - o) |x|),
the dtype's error a times the conditioning of the inversion; the strategy keeps
|s x| in [0.5, 2.5], where that conditioning is mild.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as hst

from attnconf import spec
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, expect_equivalent, for_cases, run
from attnconf.conformance.engine.tolerance import judge_output
from attnconf.reference import Case, expand_kv, oracle




def _logit(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(p) - np.log1p(-p)


def logit_gap(case: Case) -> np.ndarray:
    """x_i = q_i.(k0 - k1) in float64 on the dtype-rounded inputs, (B, Hq, Lq)."""
    k = expand_kv(case.k, case.shape["Hq"])
    return np.einsum("bhid,bhd->bhi", case.q, k[:, :, 0] - k[:, :, 1])


def scale_interval(out0: np.ndarray, a: float, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scales s for which sigmoid(s x) lies within +-a of out0, elementwise."""
    lo = _logit(np.clip(out0 - a, 0.0, 1.0)) / x
    hi = _logit(np.clip(out0 + a, 0.0, 1.0)) / x
    return np.minimum(lo, hi), np.maximum(lo, hi)


def _declared(case: Case) -> str:
    return f"default 1/sqrt(Dk) with Dk={case.shape['Dk']}" if case.scale is None else "given"




@clauses("ATTN-OP-4", "ATTN-PROP-8")
@for_cases(st.two_key_cases(), weight=0.5)
def test_effective_scale_is_declared(impl, case):
    """The scale recovered from two-key weights is 1/sqrt(Dk), or the given scale, within what the
    output tolerance allows."""
    res = run(impl, case)
    a = judge_output(res.out, case).allowed_max
    x = logit_gap(case)
    lo, hi = scale_interval(oracle(case).out[..., 0], a, x)
    s_eff = _logit(res.out[..., 0]) / x
    bad = np.argwhere(~((s_eff >= lo) & (s_eff <= hi)))
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        expect(False, "ATTN-OP-4", f"effective scale {s_eff[i]:.6g} (recovered from the two-key weights of row {i}) "
               f"is not the declared {case.effective_scale:.6g} ({_declared(case)}); the output tolerance allows "
               f"[{lo[i]:.6g}, {hi[i]:.6g}]", case, impl)
    expect_close(res.out, case, impl, clause="ATTN-OP-4")


@clauses("ATTN-PROP-8")
@for_cases(st.cases(max_len=65, custom_scale=False), weight=0.3)
def test_scale_homogeneity(impl, case):
    """attn(c Q, K, V, scale = s / c) = attn(Q, K, V, scale = s): each run within tolerance of its
    own reference, and the two within the sum of their allowances."""
    rng = np.random.default_rng(case.seed)
    top = st.FINITE_MAX[case.dtype] / 2 / max(float(np.abs(case.q).max(initial=1.0)), 1e-30)
    cs = [c for c in (2.0, 0.5, 4.0, 0.25, 3.0, -1.0) if abs(c) <= top]
    c = cs[int(rng.integers(len(cs)))]
    scaled = case.replace(q=c * case.q, scale=case.effective_scale / c)
    expect_equivalent(impl, case, scaled, clause="ATTN-PROP-8", what=f"attn(cQ, scale=s/c) vs attn(Q, scale=s) with c={c:g}")


@clauses("ATTN-PROP-6")
@for_cases(st.cases(max_len=65, sinks=True), weight=0.3)
def test_row_constant_bias_changes_nothing(impl, case):
    """Adding a constant to every logit of a row (a bias constant along the key axis) leaves the output
    unchanged, within the tolerance of each case and their combined allowance. With sinks the constant is
    one per head and the sink logit moves with it (a sink that stays put would change the rows)."""
    rng = np.random.default_rng(case.seed)
    s = case.shape
    per = (1, s["Hq"], 1, 1) if case.sinks is not None else (s["B"], s["Hq"], s["Lq"], 1)
    shift = rng.normal(size=per) * [1.0, 30.0, 1000.0][int(rng.integers(3))]
    if case.dtype == "float16":
        shift = np.clip(shift, -3e4, 3e4)
    old = np.zeros((1, 1, 1, 1)) if case.bias is None else case.bias
    shifted = case.replace(bias=old + shift)
    if case.sinks is not None:
        shifted = shifted.replace(sinks=case.sinks + shift[0, :, 0, 0])
    expect_equivalent(impl, case, shifted, clause="ATTN-PROP-6", what="a row-constant bias changed the output")


def two_sided_z(alpha: float) -> float:
    """z with P(|N(0, 1)| > z) = alpha, by bisection on erfc (no SciPy needed)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > alpha else (lo, mid)
    return hi


SAMPLES = 2 ** 18


@clauses("ATTN-PROP-4", "ATTN-OP-4")
@for_cases(st.two_key_cases(dk=hst.integers(1, 256), custom_scale=False), weight=0.3)
def test_default_scale_gives_unit_logit_variance(impl, case):
    """With unit-variance q and k the default-scaled logit s_eff q.k has variance 1, for the scale
    s_eff the kernel applies.

    s_eff is known only to the interval [s_lo, s_hi] that the kernel's two-key output allows (the
    intersection over rows). Then n = 2^18 logits y = q.k are sampled with NumPy (seeded by the case;
    (q.k)^2 is drawn as chi2(Dk) * N(0, 1)^2, the same distribution)
    and mean(y^2) * s^2 must come within z * sqrt((2 + 6/Dk) / n) of 1 for some s in that interval:
    Var(y^2 / Dk) = 2 + 6/Dk exactly for Gaussian q, k. z is the two-sided normal quantile of
    alpha = [statistics] alpha (1e-6, z = 4.89), so a kernel with the right scale fails with
    probability about alpha; the normal approximation's error at n = 2^18 is below 2e-7 even
    for Dk = 1 (first Edgeworth term), so the confidence is at least 1 - 1.2e-6.
    """
    res = run(impl, case)
    a = judge_output(res.out, case).allowed_max
    x = logit_gap(case)
    lo, hi = scale_interval(res.out[..., 0], a, x)          # scales consistent with the kernel's output
    s_lo, s_hi = float(lo.max()), float(hi.min())
    if s_lo > s_hi:                                           # rows disagree: no single scale; take the hull
        s_lo, s_hi = float(lo.min()), float(hi.max())
    d = case.shape["Dk"]
    rng = np.random.default_rng(case.seed)
    # q.k for independent N(0, 1) vectors is |q| g with |q|^2 ~ chi2(Dk) and g ~ N(0, 1) independent,
    # so (q.k)^2 is sampled exactly, at O(n) instead of O(n Dk) cost.
    y2 = float((rng.chisquare(d, SAMPLES) * np.square(rng.normal(size=SAMPLES))).sum())
    m = y2 / SAMPLES                                   # estimates E[(q.k)^2] = Dk
    z = two_sided_z(spec.tolerances()["statistics"]["alpha"])
    half = z * math.sqrt((2 + 6 / d) / SAMPLES)
    var_lo, var_hi = s_lo ** 2 * m, s_hi ** 2 * m
    if s_lo < 0 < s_hi:
        var_lo = 0.0
    expect(var_lo <= 1 + half and var_hi >= 1 - half, "ATTN-PROP-4",
           f"default-scaled logit variance {var_lo:.4g}..{var_hi:.4g} (s_eff in [{s_lo:.6g}, {s_hi:.6g}], Dk={d}) "
           f"is not 1 +- {half:.3g} (z={z:.2f}, n={SAMPLES})", case, impl)
