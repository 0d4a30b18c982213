"""The tolerance model of ATTN-TOL-1..5, as a function from arrays to a judgement.

A kernel at precision t may err by a small multiple of what a naive
implementation at t errs on the same case (reference/emulate.py), plus a
rounding floor computed in t. float64 has nothing finer to emulate, so it is
held to an analytic rounding-error bound instead. The multipliers live in
spec/tolerances.toml; SPEC.md derives them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnconf import spec
from attnconf.reference import Case, oracle, round_to
from attnconf.reference.attention import expand_kv
from attnconf.reference.backward import group_sum, reduce_to_shape

EPS64 = np.finfo(np.float64).eps
# float64's smallest normal number: below it a result keeps no relative precision (a kernel may flush
# subnormals to 0), so every float64 comparison allows that much absolute error
TINY64 = np.finfo(np.float64).tiny


@dataclass
class Judgement:
    ok: bool
    quantity: str
    dtype: str
    e_max: float
    e_mean: float
    allowed_max: float
    allowed_mean: float
    base_max: float
    base_mean: float
    floor: float
    ratio_max: float      # e_kernel / e_base (float64: e / analytic bound)
    ratio_mean: float
    reason: str = ""
    worst: tuple | None = None

    def explain(self) -> str:
        if self.reason:
            return self.reason
        return (f"{self.quantity}: max error {self.e_max:.3g} vs allowed {self.allowed_max:.3g}; "
                f"mean error {self.e_mean:.3g} vs allowed {self.allowed_mean:.3g}; ratio {self.ratio_max:.3g}")


def _finfo(dtype: str):
    from attnconf.reference import numpy_dtype

    t = numpy_dtype(dtype)
    try:
        return np.finfo(t)
    except ValueError:   # bfloat16 (ml_dtypes) keeps its own finfo
        import ml_dtypes

        return ml_dtypes.finfo(t)


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype` at |x| (one unit in the last place), after rounding |x| to `dtype`.

    Computed from the exponent, 2**(max(e, emin) - mantissa bits), so a magnitude at or beyond the
    dtype's largest finite value gets the ulp of its own binade, as if the exponent range went on,
    never inf (the floor it feeds would otherwise let every error, even 0, fail).
    """
    info = _finfo(dtype)
    a = np.abs(np.asarray(x, dtype=np.float64))
    r = np.where(a > float(info.max), a, round_to(a, dtype))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(r > 0, r, 1.0)))
    e = np.where(r > 0, np.maximum(e, info.minexp), info.minexp)
    return np.exp2(e - info.nmant)


def rounding_noise(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Rounding noise at x's magnitude in `dtype`: max(|(x + 0.3 - 0.3) - x|, ulp(x)), elementwise.

    The roundtrip is flash-attention's floor; one ulp of the output is added as its
    minimum because any final rounding to t may cost it while the baseline can be exact by luck.
    Beyond the dtype's largest finite value (a gradient's summed terms can be) the roundtrip would
    overflow, so the noise there is the ulp alone.
    """
    a = np.abs(np.asarray(ref, dtype=np.float64))
    beyond = a > float(_finfo(dtype).max) / 2
    x = round_to(np.where(beyond, 0.0, a), dtype)
    with np.errstate(all="ignore"):
        y = round_to(round_to(x + 0.3, dtype) - 0.3, dtype)
        trip = np.abs(y - x)
    return np.maximum(np.where(beyond, 0.0, trip), ulp(a, dtype))


def _ratio(e: float, base: float) -> float:
    if e == 0:
        return 0.0
    return e / base if base > 0 else float("inf")


def judge_arrays(actual: np.ndarray, ref: np.ndarray, base_err: np.ndarray, dtype: str, *,
                 quantity: str = "out", model: str = "forward", magnitude: np.ndarray | None = None,
                 mask: np.ndarray | None = None, factor: float = 1.0) -> Judgement:
    """ATTN-TOL-1, -2, -3 for one quantity, given the baseline's elementwise error |O_base - O_ref|.

    `mask` restricts the judgement (errors, baseline and floor) to the elements where it is True;
    `factor` multiplies the allowance (a divergence's stated bound, never the spec's own model).
    """
    tol = spec.tolerances()[model]
    actual = np.asarray(actual)
    finite = np.isfinite(ref)
    if mask is not None:
        finite = finite & np.broadcast_to(mask, ref.shape)
    bad = finite & ~np.isfinite(actual)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return Judgement(False, quantity, dtype, float("inf"), float("inf"), 0, 0, 0, 0, 0, float("inf"),
                         float("inf"), f"[ATTN-TOL-3] {quantity}: {int(bad.sum())} non-finite value(s) where the "
                         f"reference is finite, first at {idx}: got {actual[idx]}, reference {ref[idx]:.6g}", idx)
    if not finite.any():
        return Judgement(True, quantity, dtype, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    err = np.abs(np.where(finite, actual, 0.0) - np.where(finite, ref, 0.0))[finite]
    berr = np.asarray(base_err)[finite]
    berr = np.where(np.isfinite(berr), berr, 0.0)
    # The floor is rounding noise at the result's magnitude, or at the magnitude of the terms it is
    # summed from where the caller knows it (gradients: exact zeros arise by cancellation there).
    at = ref if magnitude is None else np.maximum(np.abs(ref), magnitude)
    noise = rounding_noise(np.where(finite, at, 0.0), dtype)[finite]
    floor = tol["floor_factor"] * float(noise.max())
    floor_mean = tol["floor_factor"] * float(noise.mean())
    e_max, e_mean = float(err.max()), float(err.mean())
    b_max, b_mean = float(berr.max()), float(berr.mean())
    allowed_max = factor * (tol["c_max"] * b_max + floor)
    allowed_mean = factor * (tol["c_mean"] * b_mean + floor_mean)
    ok = e_max <= allowed_max and e_mean <= allowed_mean
    with np.errstate(invalid="ignore"):
        full_err = np.abs(np.where(finite, actual - np.where(finite, ref, 0.0), 0.0))
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(full_err), full_err.shape))
    # The recorded ratio divides by the baseline error, but never by less than one rounding unit
    # (floor / floor_factor): a baseline that is exact by luck would make any ratio meaningless.
    unit, unit_mean = floor / tol["floor_factor"], floor_mean / tol["floor_factor"]
    j = Judgement(ok, quantity, dtype, e_max, e_mean, allowed_max, allowed_mean, b_max, b_mean, floor,
                  _ratio(e_max, max(b_max, unit)), _ratio(e_mean, max(b_mean, unit_mean)), worst=worst)
    if not ok:
        which = "ATTN-TOL-1" if e_max > allowed_max else "ATTN-TOL-2"
        times = f"{factor:g} x " if factor != 1 else ""
        j.reason = (f"[{which}] {quantity} ({dtype}): max error {e_max:.3g} (allowed {times}({tol['c_max']:g} x baseline "
                    f"{b_max:.3g} + floor {floor:.3g}) = {allowed_max:.3g}); mean error {e_mean:.3g} (allowed "
                    f"{allowed_mean:.3g}); ratio {j.ratio_max:.3g}; worst at {worst}: got {actual[worst]:.6g}, "
                    f"reference {ref[worst]:.6g}")
    return j


def _float64_terms(case: Case) -> tuple[int, int]:
    """(the multiplier of A_i, the constant) of ATTN-TOL-4's bracket: (Dk + 2, 2 Lk + 4), with a softcap's
    four roundings (Dk + 6) and a sink's extra denominator term (2 (Lk + 1) + 4) (SPEC §12.5)."""
    s = case.shape
    return (s["Dk"] + (6 if case.softcap is not None else 2),
            2 * (s["Lk"] + (1 if case.sinks is not None else 0)) + 4)


def _logit_magnitude(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Per query row: A_i = max visible |scale| sum_d |q k| + |bias| (ALiBi included; at least |sink|)
    and Vmax_i (ATTN-TOL-4)."""
    cached = case._cache.get("tol64")
    if cached is not None:
        return cached
    f = oracle(case)
    hq = case.shape["Hq"]
    mag = abs(case.effective_scale) * np.einsum("bhid,bhjd->bhij", np.abs(case.q), np.abs(expand_kv(case.k, hq)))
    if case.bias is not None:
        mag = mag + np.abs(np.where(np.isneginf(case.bias), 0.0, case.bias))
    if case.alibi_slopes is not None:       # ALiBi is a bias (SPEC §12.5)
        from attnconf.reference.attention import alibi_bias

        mag = mag + np.abs(alibi_bias(mag.shape, case.alibi_slopes, case.window_align, case.q_lengths,
                                      case.kv_lengths))
    a = np.where(f.visible, mag, 0.0).max(axis=-1, initial=0.0)
    if case.sinks is not None:              # exp(sink - m) is formed from the sink's distance to the maximum
        a = np.maximum(a, np.abs(case.sinks)[None, :, None])
    vabs = np.abs(expand_kv(case.v, hq)).max(axis=-1)                 # (B, H, Lk)
    vmax = np.where(f.visible, vabs[:, :, None, :], 0.0).max(axis=-1, initial=0.0)
    case._cache["tol64"] = (a, vmax)
    return a, vmax


def judge_float64(actual: np.ndarray, case: Case, *, quantity: str = "out", mask: np.ndarray | None = None,
                  factor: float = 1.0) -> Judgement:
    """ATTN-TOL-4: the analytic float64 bound, per output row (`mask`, `factor` as in judge_arrays)."""
    ref = oracle(case).out
    actual = np.asarray(actual)
    finite = np.isfinite(ref)
    if mask is not None:
        finite = finite & np.broadcast_to(mask, ref.shape)
    if (finite & ~np.isfinite(actual)).any():
        return judge_arrays(actual, ref, np.zeros_like(ref), "float64", quantity=quantity, mask=mask)
    gamma = spec.tolerances()["float64"]["gamma"]
    a, vmax = _logit_magnitude(case)
    s = case.shape
    ka, kc = _float64_terms(case)
    bound = factor * gamma * EPS64 * vmax * (ka * a + kc)      # (B, H, Lq)
    with np.errstate(invalid="ignore"):
        err = np.abs(np.where(finite, actual - np.where(finite, ref, 0.0), 0.0))
    row_err = err.max(axis=-1, initial=0.0)
    ratios = row_err / np.maximum(bound, TINY64)
    ratio_max = float(ratios.max(initial=0.0))
    ok = bool((row_err <= bound + TINY64).all())
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(err), err.shape))
    j = Judgement(ok, quantity, "float64", float(err.max(initial=0)), float(err.mean()) if err.size else 0.0,
                  float(bound.max(initial=0)), float(bound.mean()) if bound.size else 0.0,
                  float(bound.max(initial=0)), float(bound.mean()) if bound.size else 0.0, 0.0,
                  ratio_max, float(ratios.mean()) if ratios.size else 0.0, worst=worst)
    if not ok:
        r = tuple(int(i) for i in np.unravel_index(np.argmax(ratios), ratios.shape))
        j.reason = (f"[ATTN-TOL-4] {quantity} (float64): row {r} error {row_err[r]:.3g} exceeds the analytic bound "
                    f"{bound[r]:.3g} (ratio {ratio_max:.3g}); worst at {worst}: got {actual[worst]:.17g}, "
                    f"reference {ref[worst]:.17g}")
    return j


def judge_output(actual: np.ndarray, case: Case, *, mask: np.ndarray | None = None,
                 factor: float = 1.0) -> Judgement:
    """The forward output under the model that fits the case's dtype.

    Elements an applied divergence already judged (`actual.exempt`, see harness.run) are left out.
    """
    mask = _unexempt(actual, mask)
    if case.dtype == "float64":
        return judge_float64(actual, case, mask=mask, factor=factor)
    from attnconf.reference import baseline_error

    return judge_arrays(actual, oracle(case).out, baseline_error(case)[0], case.dtype, mask=mask, factor=factor)


def weights_as_output(case: Case) -> Case:
    """The case whose output is `case`'s weights: V the identity over the keys (Dv = Lk). Returned weights are
    judged as that output, so they get the output's own baseline (test_weights, the alternatives)."""
    s = case.shape
    eye = np.broadcast_to(np.eye(s["Lk"]), (s["B"], s["Hkv"], s["Lk"], s["Lk"]))
    return case.replace(v=eye, grad_out=None)


def _unexempt(actual, mask: np.ndarray | None) -> np.ndarray | None:
    """The elements to judge: `mask` (default all) minus those a divergence already judged."""
    exempt = getattr(actual, "exempt", None)
    if exempt is None:
        return mask
    keep = ~np.broadcast_to(exempt, np.shape(actual))
    return keep if mask is None else keep & np.broadcast_to(mask, np.shape(actual))


def judge_lse(actual: np.ndarray, case: Case, *, mask: np.ndarray | None = None, factor: float = 1.0) -> Judgement:
    """The log-sum-exp: -inf for empty rows; otherwise the forward model (float64: analytic bound)."""
    mask = _unexempt(actual, mask)
    ref = oracle(case).lse
    actual = np.asarray(actual, dtype=np.float64)
    if mask is not None:
        m = np.broadcast_to(mask, ref.shape)
        ref, actual = np.where(m, ref, 0.0), np.where(m, actual, 0.0)
    empty = np.isneginf(ref)
    if (empty & ~np.isneginf(actual)).any():
        idx = tuple(int(i) for i in np.argwhere(empty & ~np.isneginf(actual))[0])
        return Judgement(False, "lse", case.dtype, float("inf"), float("inf"), 0, 0, 0, 0, 0, float("inf"),
                         float("inf"), f"[ATTN-EMPTY-2] lse of fully-masked row {idx} is {actual[idx]}, not -inf", idx)
    ref_f = np.where(empty, 0.0, ref)
    act_f = np.where(empty, 0.0, actual)
    if case.dtype == "float64":
        a, _ = _logit_magnitude(case)
        gamma = spec.tolerances()["float64"]["gamma"]
        ka, kc = _float64_terms(case)
        bound = factor * gamma * EPS64 * (ka * a + np.abs(ref_f) + kc)
        err = np.abs(act_f - ref_f)
        ratio = float((err / np.maximum(bound, 1e-300)).max(initial=0))
        j = Judgement(bool((err <= bound + TINY64).all()), "lse", "float64", float(err.max(initial=0)), float(err.mean()),
                      float(bound.max(initial=0)), float(bound.mean()), float(bound.max(initial=0)),
                      float(bound.mean()), 0.0, ratio, ratio)
        if not j.ok:
            j.reason = f"[ATTN-TOL-4] lse (float64): error {j.e_max:.3g} exceeds the analytic bound (ratio {ratio:.3g})"
        return j
    from attnconf.reference import baseline_error

    return judge_arrays(act_f, ref_f, np.where(empty, 0.0, baseline_error(case)[1]), case.dtype, quantity="lse",
                        mask=mask, factor=factor)


def judge_gradients(grads: dict[str, np.ndarray], case: Case, *, masks: dict[str, np.ndarray] | None = None,
                    factor: float = 1.0) -> list[Judgement]:
    """ATTN-TOL-5 for dq, dk, dv (and dbias) against the analytic float64 backward.

    `masks` restricts each gradient's judgement to some elements; elements an applied divergence
    already judged (`grads[name].exempt`) are left out."""
    from attnconf.reference.backward import backward

    ref = backward(case)
    out = []
    if case.dtype == "float64":
        bounds = _gradient_bounds64(case)
    else:
        from attnconf.reference.emulate_backward import gradient_baseline_error

        base_err = gradient_baseline_error(case)
        mags = gradient_magnitudes(case)
    for name in ("dq", "dk", "dv", "dbias"):
        if name not in grads or getattr(ref, name) is None:
            continue
        r = getattr(ref, name)
        m = _unexempt(grads[name], None if masks is None else masks.get(name))
        g = np.broadcast_to(grads[name], r.shape) if grads[name].shape != r.shape else np.asarray(grads[name])
        if case.dtype == "float64":
            out.append(_judge_grad64(g, r, factor * bounds[name], name, mask=m))
        else:
            out.append(judge_arrays(g, r, base_err[name], case.dtype, quantity=name, model="gradient",
                                    magnitude=mags[name], mask=m, factor=factor))
    return out


def _gradient_bounds64(case: Case) -> dict[str, np.ndarray]:
    """Elementwise float64 bounds: gamma eps64 K |X|_abs, with |X|_abs the backward recomputed on magnitudes."""
    a, _ = _logit_magnitude(case)
    s = case.shape
    ka, kc = _float64_terms(case)
    k = ka * float(a.max(initial=0)) + kc + s["Dv"]
    gamma = spec.tolerances()["float64"]["gamma"]
    return {n: gamma * EPS64 * k * m for n, m in gradient_magnitudes(case).items()}


def gradient_magnitudes(case: Case) -> dict[str, np.ndarray]:
    """|dX|_abs: the backward recomputed on magnitudes (|dO|, |V|, |K|, |Q|, P, |dP| + |delta|)."""
    f = oracle(case)
    s = case.shape
    hq, hkv = s["Hq"], s["Hkv"]
    p = f.weights
    do = np.abs(case.grad_out)
    ke, ve = np.abs(expand_kv(case.k, hq)), np.abs(expand_kv(case.v, hq))
    dp = do @ np.swapaxes(ve, -1, -2)
    delta = (do * np.abs(f.out)).sum(axis=-1, keepdims=True)
    ds = p * (dp + delta)
    sc = abs(case.effective_scale)
    mags = {"dq": sc * ds @ ke,
            "dk": group_sum(sc * np.swapaxes(ds, -1, -2) @ np.abs(case.q), hkv),
            "dv": group_sum(np.swapaxes(p, -1, -2) @ do, hkv)}
    if case.bias is not None:
        mags["dbias"] = reduce_to_shape(ds, case.bias.shape)
    return mags


def _judge_grad64(g: np.ndarray, r: np.ndarray, bound: np.ndarray, name: str,
                  mask: np.ndarray | None = None) -> Judgement:
    keep = np.ones(r.shape, bool) if mask is None else np.broadcast_to(mask, r.shape)
    with np.errstate(invalid="ignore"):
        err = np.where(keep, np.abs(g - r), 0.0)
    bad = keep & np.isfinite(r) & ~np.isfinite(g)
    ok = bool((err <= bound + TINY64).all()) and not bad.any()
    ratios = err / np.maximum(bound, TINY64)
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(ratios), ratios.shape)) if ratios.size else None
    j = Judgement(ok, name, "float64", float(err.max(initial=0)), float(err.mean()) if err.size else 0.0,
                  float(bound.max(initial=0)), float(bound.mean()) if bound.size else 0.0, 0, 0, 0,
                  float(ratios.max(initial=0)), float(ratios.mean()) if ratios.size else 0.0, worst=worst)
    if not ok:
        j.reason = (f"[ATTN-TOL-5] {name} (float64): error {err[worst]:.3g} exceeds the bound {bound[worst]:.3g} at "
                    f"{worst}: got {g[worst]:.17g}, reference {r[worst]:.17g}")
    return j


def judge_layer(actual: np.ndarray, lc, *, mask: np.ndarray | None = None, factor: float = 1.0,
                ref: np.ndarray | None = None, base_err: np.ndarray | None = None,
                magnitude: np.ndarray | None = None, as_dtype: str | None = None) -> Judgement:
    """ATTN-MHA-1 under the forward model: naive layer at the dtype as yardstick; float64 analytic.

    `ref`, `base_err`, `magnitude` and `as_dtype` let a divergence judge the layer against its
    alternative (another reference, the yardstick of another precision); `mask`, `factor` as in
    judge_arrays."""
    from attnconf.reference.layer import layer_baseline_error, mha

    mask = _unexempt(actual, mask)
    ref = mha(lc) if ref is None else ref
    actual = np.asarray(actual)
    if actual.shape != ref.shape:
        return Judgement(False, "layer", lc.dtype, float("inf"), float("inf"), 0, 0, 0, 0, 0, float("inf"),
                         float("inf"), f"[ATTN-MHA-1] layer output shape {actual.shape} != {ref.shape}")
    dtype = as_dtype or lc.dtype
    if dtype != "float64":
        return judge_arrays(actual, ref, layer_baseline_error(lc) if base_err is None else base_err, dtype,
                            quantity="layer", mask=mask, factor=factor, magnitude=magnitude)
    # float64: rounding of four E-long projections and the attention (bound of ATTN-TOL-4, per element).
    e = lc.x_q.shape[-1]
    xa = [np.abs(x) @ np.abs(w) for x, w in ((lc.x_q, lc.w_q), (lc.x_k, lc.w_k), (lc.x_v, lc.w_v))]
    d = e // lc.num_heads
    a = float((xa[0].max() * xa[1].max()) * d / np.sqrt(d))
    y_abs = (xa[2].max(axis=1, keepdims=True) + 0 * ref) @ np.abs(lc.w_o)
    bound = factor * spec.tolerances()["float64"]["gamma"] * EPS64 * (4 * e + (d + 2) * a + 2 * lc.x_k.shape[1] + 8) \
        * np.maximum(y_abs, np.abs(ref))
    keep = np.ones(ref.shape, bool) if mask is None else np.broadcast_to(mask, ref.shape)
    with np.errstate(invalid="ignore"):
        err = np.where(keep, np.abs(actual - ref), 0.0)
    bad = keep & np.isfinite(ref) & ~np.isfinite(actual)
    ratio = float((err / np.maximum(bound, 1e-300)).max(initial=0))
    j = Judgement(bool((err <= bound + TINY64).all()) and not bad.any(), "layer", "float64", float(err.max(initial=0)),
                  float(err.mean()), float(bound.max(initial=0)), float(bound.mean()), float(bound.max(initial=0)),
                  float(bound.mean()), 0.0, ratio, ratio)
    if not j.ok:
        j.reason = f"[ATTN-MHA-1] layer (float64): error {j.e_max:.3g} exceeds the analytic bound (ratio {ratio:.3g})"
    return j
