"""What an implementation does instead, inside a divergence's region: computed and checked.

Each divergence entry names its behaviour with `instead` (spec/divergences/README.md); this
module computes what that behaviour gives on a case and judges the covered elements of a result
against it. An element that conforms to the spec itself is always accepted too: an implementation
that got better is not a failure (its entry is then reported stale by the witness check).

Every check returns a `Verdict`: ok, a one-line detail, and the ratio of error to allowance.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from attnconf.reference import Case, expand_kv, oracle
from attnconf.reference.emulate import _rounder, seq_matmul

from attnconf.conformance.engine import tolerance as T

FORWARD = ("out", "lse")
GRADIENTS = ("dq", "dk", "dv", "dbias")


@dataclass
class Verdict:
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Alternative:
    name: str
    defines: tuple[str, ...]          # the quantities it says something about ("call" for raise/return)
    check: Callable[..., Verdict] | None = None
    numeric: bool = False             # bounds the error of every covered element
    # multiplies its allowance by the entry's `bound` (required with region "any", refused elsewhere)
    takes_bound: bool = False


ALTERNATIVES: dict[str, Alternative] = {}


def alternative(name: str, defines: tuple[str, ...], *, numeric: bool = False, takes_bound: bool = False):
    def register(fn):
        ALTERNATIVES[name] = Alternative(name, defines, fn, numeric, takes_bound)
        return fn
    return register


def _bound(entry: dict[str, Any]) -> float:
    """The factor on an alternative's allowance that the entry states (`bound`; 1 where none is needed)."""
    return float(entry.get("bound", 1.0))


ALTERNATIVES["raises"] = Alternative("raises", ("call",))
ALTERNATIVES["returns"] = Alternative("returns", ("call",))
# the output comes back as float32 for half-precision inputs; its values are judged as usual, at the case's dtype
ALTERNATIVES["output_float32"] = Alternative("output_float32", ("call",))


# ---- helpers -----------------------------------------------------------------------

def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _exact(name: str, actual: np.ndarray, mask: np.ndarray, good: Callable[[np.ndarray], np.ndarray],
           what: str) -> Verdict:
    bad = mask & ~good(actual)
    if bad.any():
        idx = _first(bad)
        return Verdict(False, f"{name}: {int(bad.sum())} covered element(s) are not {what}; first at {idx}: "
                              f"{actual[idx]!r}")
    return Verdict(True)


def _judged(j: T.Judgement) -> Verdict:
    return Verdict(j.ok, "" if j.ok else j.explain())


# ---- exact values --------------------------------------------------------------------

@alternative("zero", ("out",))
def _zero(entry, case, res, masks) -> Verdict:
    return _exact("out", res.out, masks["out"], lambda a: a == 0, "exactly 0")


@alternative("nan", FORWARD + GRADIENTS)
def _nan(entry, case, res, masks) -> Verdict:
    for q, m in masks.items():
        arr = getattr(res, q) if q in FORWARD else (res.grads or {}).get(q)
        if arr is not None:
            v = _exact(q, np.broadcast_to(np.asarray(arr), m.shape), m, np.isnan, "NaN")
            if not v.ok:
                return v
    return Verdict(True)


@alternative("nan_or_zero", ("out",))
def _nan_or_zero(entry, case, res, masks) -> Verdict:
    """Each covered row is entirely NaN or entirely exactly 0."""
    out = np.asarray(res.out)
    rows = masks["out"].any(axis=-1)
    good = np.isnan(out).all(axis=-1) | (out == 0).all(axis=-1)
    bad = rows & ~good
    if bad.any():
        idx = _first(bad)
        return Verdict(False, f"out row {idx}: neither all NaN nor all 0: {out[idx][:4]}")
    return Verdict(True)


@alternative("non_finite", ("out", "lse"))
def _non_finite(entry, case, res, masks) -> Verdict:
    for q in ("out", "lse"):
        if q in masks:
            v = _exact(q, getattr(res, q), masks[q], lambda a: ~np.isfinite(a), "NaN or inf")
            if not v.ok:
                return v
    return Verdict(True)


@alternative("non_finite_or_spec", ("out",))
def _non_finite_or_spec(entry, case, res, masks) -> Verdict:
    """Each covered row is entirely NaN/inf, or is judged as if the entry did not cover it (by the
    spec, or by another entry that covers it): for an overflow that depends on the order in which
    the implementation sums, which the region bounds but cannot predict element by element. A row
    that is only partly non-finite fails."""
    out = np.asarray(res.out)
    rows = masks["out"].any(axis=-1)
    gone = (~np.isfinite(out)).all(axis=-1)
    partial = rows & ~gone & (~np.isfinite(out)).any(axis=-1)
    if partial.any():
        idx = _first(partial)
        return Verdict(False, f"out row {idx}: partly non-finite (neither all NaN/inf nor the spec's row): {out[idx][:4]}")
    masks["out"] &= gone[..., None]     # finite rows stay unexempted: the spec or the next entry judges them
    return Verdict(True)


# ---- uniform weights: a mask applied as a large finite negative ------------------------

def uniform_weights(case: Case, rows: np.ndarray) -> np.ndarray:
    """(B, Hq, Lq, Lk): on `rows`, equal weights over the keys hidden by the mask, causal alignment,
    window or padding (regions.mask_hidden_keys); 0 elsewhere."""
    from attnconf.conformance.engine.regions import mask_hidden_keys

    keys = mask_hidden_keys(case) & rows[..., None]
    n = keys.sum(axis=-1, keepdims=True)
    return np.where(keys, 1.0 / np.maximum(n, 1), 0.0)


def _mean_rows(mask_out: np.ndarray) -> np.ndarray:
    return mask_out.any(axis=-1)


@alternative("mean_of_values", ("out", "lse"), numeric=True)
def _mean_of_values(entry, case, res, masks) -> Verdict:
    if hasattr(case, "num_heads"):
        return _layer_mean_of_values(case, res, masks)
    if "out" in masks:
        v = _mean_of_values_out(case, res, masks, entry.get("_as_dtype"))
        if not v.ok:
            return v
    if "lse" in masks and res.lse is not None:
        lse = np.asarray(res.lse, dtype=np.float64)
        good = np.isneginf(lse) | (np.isfinite(lse) & (lse <= -1e30))
        return _exact("lse", lse, masks["lse"], lambda a: good, "-inf or a finite value below -1e30")
    return Verdict(True)


def _mean_of_values_out(case, res, masks, as_dtype: str | None = None) -> Verdict:
    return _mean_of_values_judge(case, res, _mean_rows(masks["out"]), as_dtype)(masks["out"])


def _mean_of_values_judge(case, res, rows: np.ndarray, as_dtype: str | None = None) -> Callable[[np.ndarray], Verdict]:
    """The judgement of `res.out` against the mean of V over the mask-hidden keys of `rows`, for any mask of
    output elements within those rows: the expected values and allowances are computed once."""
    w = uniform_weights(case, rows)
    v = expand_kv(case.v, case.shape["Hq"])
    expected = np.einsum("bhij,bhjd->bhid", w, np.where(np.isfinite(v), v, 0.0))
    # the floor is taken at the magnitude of the averaged terms (a mean can cancel to near 0)
    vmax = np.where(rows[..., None], np.abs(np.where(np.isfinite(v), v, 0.0)).max(axis=-2, keepdims=True), 0.0)
    dtype = as_dtype or case.dtype
    if dtype == "float64":
        lk = case.shape["Lk"]
        bound = 2 * T.spec.tolerances()["float64"]["gamma"] * T.EPS64 * (lk + 4) * vmax
        with np.errstate(invalid="ignore"):
            wrong = ~(np.abs(np.asarray(res.out) - expected) <= bound)

        def judge(mask: np.ndarray) -> Verdict:
            bad = mask & wrong
            if bad.any():
                idx = _first(bad)
                return Verdict(False, f"out row {idx[:3]}: {res.out[idx]:.17g} is not the mean of V {expected[idx]:.17g}")
            return Verdict(True)
        return judge
    base = _weighted_sum_error(w, expected, case, dtype)
    return lambda mask: _judged(T.judge_arrays(res.out, expected, base, dtype, quantity="out (mean of V)",
                                               magnitude=vmax, mask=mask))


def _layer_mean_of_values(lc, res, masks) -> Verdict:
    from attnconf.reference.layer import mha

    rows = masks["out"].any(axis=-1)                     # (B, Lq)

    def attend(q, k, v, *, mask=None, causal=None):
        from attnconf.reference import forward

        f = forward(q, k, v, mask=mask, causal=causal)
        mean = np.broadcast_to(v.mean(axis=-2, keepdims=True), f.out.shape)
        return np.where(rows[:, None, :, None], mean, f.out)

    expected = mha(lc, attend)
    mag = np.abs(expected) + np.abs(lc.x_v).max() * np.abs(lc.w_v).sum(0).max() * np.abs(lc.w_o).sum(0)
    return _judged(T.judge_layer(res.out, lc, mask=masks["out"], ref=expected, magnitude=mag))


@alternative("hidden_mean_or_spec", ("out",))
def _hidden_mean_or_spec(entry, case, res, masks) -> Verdict:
    """Each covered row is the mean of V over its mask-hidden keys (every other logit became -inf and
    the mask's finite fill took the weight), within mean_of_values' allowance, or is judged as if
    uncovered (by the spec or another entry): whether the logits reach -inf depends on the summation
    order, which the region bounds but cannot predict row by row."""
    rows = masks["out"].any(axis=-1)
    taken = np.zeros_like(rows)
    judge = _mean_of_values_judge(case, res, rows)
    for idx in map(tuple, np.argwhere(rows)):
        one = np.zeros_like(masks["out"])
        one[idx] = masks["out"][idx]
        taken[idx] = judge(one).ok
    masks["out"] &= taken[..., None]     # the other rows stay unexempted: the spec or the next entry judges them
    return Verdict(True)


@alternative("uniform_weight_gradients", GRADIENTS)
def _uniform_weight_gradients(entry, case, res, masks) -> Verdict:
    """Covered rows weigh their finite-bias keys uniformly and their logits are constants: their dQ
    and dBias are 0, they add nothing to dK, and add dO_i / n to the dV of each such key."""
    from attnconf.reference.backward import backward, group_sum

    ref = backward(case)
    rows = masks["dq"].any(axis=-1) if "dq" in masks else ~oracle(case).visible.any(axis=-1)
    w = uniform_weights(case, rows)
    extra = group_sum(np.swapaxes(w, -1, -2) @ case.grad_out, case.shape["Hkv"])
    expected = {"dq": np.where(rows[..., None], 0.0, ref.dq), "dk": ref.dk, "dv": ref.dv + extra}
    if ref.dbias is not None:
        expected["dbias"] = ref.dbias
    mags = T.gradient_magnitudes(case)
    as_dtype = entry.get("_as_dtype")
    for name, exp in expected.items():
        if name not in masks or res.grads is None or name not in res.grads:
            continue
        g = np.broadcast_to(res.grads[name], exp.shape)
        if as_dtype is not None:         # a float64 case of a float32-accurate implementation
            from attnconf.reference.emulate_backward import gradient_baseline_error

            c32 = case.replace(dtype=as_dtype)
            base = gradient_baseline_error(c32)[name] + np.nan_to_num(np.abs(getattr(backward(c32), name) - getattr(ref, name)))
            mag = mags[name] + (group_sum(np.swapaxes(w, -1, -2) @ np.abs(case.grad_out), case.shape["Hkv"])
                                if name == "dv" else 0.0)
            j = T.judge_arrays(g, exp, base, as_dtype, quantity=name, model="gradient", magnitude=mag, mask=masks[name])
            if not j.ok:
                return _judged(j)
            continue
        if case.dtype == "float64":
            # dV also sums w dO over the Lq rows of each group: that sum's rounding, on top of the bound
            spread = 0.0
            if name == "dv":
                n = case.shape["Lq"] * (case.shape["Hq"] // case.shape["Hkv"])
                spread = n * T.EPS64 * group_sum(np.swapaxes(w, -1, -2) @ np.abs(case.grad_out), case.shape["Hkv"])
            bound = 2 * T._gradient_bounds64(case)[name] + 4 * T.EPS64 * np.abs(exp) + spread
            bad = masks[name] & ~(np.abs(g - exp) <= bound)
            if bad.any():
                idx = _first(bad)
                return Verdict(False, f"{name} at {idx}: {g[idx]:.17g}, expected {exp[idx]:.17g}")
            continue
        from attnconf.reference.emulate_backward import gradient_baseline_error

        mag = mags[name] + (group_sum(np.swapaxes(w, -1, -2) @ np.abs(case.grad_out), case.shape["Hkv"])
                            if name == "dv" else 0.0)
        base = gradient_baseline_error(case)[name]
        if name in entry.get("_half_accumulated", ()):    # the visible rows' products accumulate in the dtype
            from attnconf.reference.emulate_half_backward import half_accumulation_gradient_error

            base = np.maximum(base, half_accumulation_gradient_error(case)[name])
        j = T.judge_arrays(g, exp, base, case.dtype, quantity=name,
                           model="gradient", magnitude=mag, mask=masks[name])
        if not j.ok:
            return _judged(j)
    return Verdict(True)


# ---- another precision or another bound ------------------------------------------------

# an implementation that computes at a lower precision than its input: the alternative -> that precision
PRECISIONS = {"float32_precision": "float32", "float16_precision": "float16", "bfloat16_precision": "bfloat16"}
PRECISION_ORDER = ("bfloat16", "float16", "float32", "float64")     # by significand width, lowest first


@alternative("float32_precision", FORWARD + GRADIENTS + ("layer",), numeric=True)
def _float32_precision(entry, case, res, masks, dtype: str = "float32") -> Verdict:
    """The float32 tolerance model: c_max x the error a naive float32 implementation makes on the same
    inputs (the float32 yardstick plus the distance between the float32-rounded problem's reference
    and this one's), plus the float32 floor. `dtype` names another precision (float16_precision, ...)."""
    if hasattr(case, "num_heads") and dtype != "float32":
        raise ValueError(f"{dtype}_precision is defined for attention cases, not layers")
    if hasattr(case, "num_heads"):
        from attnconf.reference.layer import layer_baseline_error, mha

        lc32 = case.replace(dtype="float32")
        base = layer_baseline_error(lc32) + np.abs(mha(lc32) - mha(case))
        return _judged(T.judge_layer(res.out, case, mask=masks.get("out"), base_err=base, as_dtype="float32"))
    from attnconf.reference import baseline_error

    c32 = case.replace(dtype=dtype)
    ref, ref32 = oracle(case), oracle(c32)
    with np.errstate(invalid="ignore"):
        gap_o = np.nan_to_num(np.abs(ref32.out - ref.out), nan=0.0, posinf=0.0)
        gap_l = np.nan_to_num(np.abs(ref32.lse - ref.lse), nan=0.0, posinf=0.0)
    err_o, err_l = baseline_error(c32)
    if "out" in masks:
        j = T.judge_arrays(res.out, ref.out, err_o + gap_o, dtype, mask=masks["out"])
        if not j.ok:
            return _judged(j)
    if "lse" in masks and res.lse is not None:
        lse = np.where(np.isneginf(ref.lse), 0.0, np.asarray(res.lse, np.float64))
        j = T.judge_arrays(lse, np.where(np.isneginf(ref.lse), 0.0, ref.lse), err_l + gap_l, dtype,
                           quantity="lse", mask=masks["lse"])
        if not j.ok:
            return _judged(j)
    if res.grads and any(g in masks for g in GRADIENTS):
        from attnconf.reference.backward import backward
        from attnconf.reference.emulate_backward import gradient_baseline_error

        gref, gref32 = backward(case), backward(c32)
        berr = gradient_baseline_error(c32)
        mags = T.gradient_magnitudes(c32)
        for name in GRADIENTS:
            if name in masks and name in res.grads and getattr(gref, name) is not None:
                exp = getattr(gref, name)
                base = berr[name] + np.nan_to_num(np.abs(getattr(gref32, name) - exp))
                j = T.judge_arrays(np.broadcast_to(res.grads[name], exp.shape), exp, base, dtype, quantity=name,
                                   model="gradient", magnitude=mags[name], mask=masks[name])
                if not j.ok:
                    return _judged(j)
    return Verdict(True)


ALTERNATIVES["float16_precision"] = Alternative(
    "float16_precision", FORWARD + GRADIENTS, lambda e, c, r, m: _float32_precision(e, c, r, m, "float16"), True)
ALTERNATIVES["bfloat16_precision"] = Alternative(
    "bfloat16_precision", FORWARD + GRADIENTS, lambda e, c, r, m: _float32_precision(e, c, r, m, "bfloat16"), True)


@alternative("bounded", FORWARD + GRADIENTS + ("layer",), numeric=True, takes_bound=True)
def _bounded(entry, case, res, masks) -> Verdict:
    """The spec's own tolerance model with its allowance multiplied by the entry's `bound`."""
    f = _bound(entry)
    if hasattr(case, "num_heads"):
        return _judged(T.judge_layer(res.out, case, mask=masks["out"], factor=f))
    if "out" in masks:
        j = T.judge_output(np.asarray(res.out), case, mask=masks["out"], factor=f)
        if not j.ok:
            return _judged(j)
    if "lse" in masks and res.lse is not None:
        j = T.judge_lse(np.asarray(res.lse), case, mask=masks["lse"], factor=f)
        if not j.ok:
            return _judged(j)
    if res.grads and any(g in masks for g in GRADIENTS):
        for j in T.judge_gradients({n: np.asarray(g) for n, g in res.grads.items()}, case,
                                   masks={n: m for n, m in masks.items() if n in GRADIENTS}, factor=f):
            if not j.ok:
                return _judged(j)
    return Verdict(True)


@alternative("recomputed_weights_float32", GRADIENTS, numeric=True, takes_bound=True)
def _recomputed_weights_float32(entry, case, res, masks) -> Verdict:
    """The backward of a kernel that recomputes P as exp(s - lse) from float32 logits and a float32 lse
    (FlashAttention's backward): each weight is off by up to eps32 (|s_ij| + |lse_i| + 1) relative, and
    that reaches dV = P^T dO and, through dS = P (dP - D), dQ and dK. The allowance of SPEC section 12
    plus gamma times that propagated error, elementwise, multiplied by the entry's `bound`."""
    from attnconf.reference.backward import group_sum
    from attnconf.reference.emulate_backward import gradient_baseline_error

    if case.dtype == "float64" or case.grad_out is None or not res.grads:
        return Verdict(False, "recomputed_weights_float32 describes half and float32 gradients only")
    f = oracle(case)
    s = case.shape
    hq, hkv = s["Hq"], s["Hkv"]
    eps = float(np.finfo(np.float32).eps)
    gamma = T.spec.tolerances()["float64"]["gamma"]
    with np.errstate(all="ignore"):
        lse = np.where(np.isfinite(f.lse), np.abs(f.lse), 0.0)[..., None]
        rel = eps * (np.abs(np.where(f.visible, f.logits, 0.0)) + lse + 1.0)
        dp_err = f.weights * rel                                               # |dP_ij| error of P
        do = np.abs(case.grad_out)
        v = np.abs(expand_kv(case.v, hq))
        dpd = np.abs(do @ np.swapaxes(v, -1, -2)) + (do * np.abs(f.out)).sum(-1, keepdims=True)
        dds = dp_err * dpd                                                     # |dS| error
        sc = abs(case.effective_scale)
        extra = {"dv": group_sum(np.swapaxes(dp_err, -1, -2) @ do, hkv),
                 "dq": sc * dds @ np.abs(expand_kv(case.k, hq)),
                 "dk": group_sum(sc * np.swapaxes(dds, -1, -2) @ np.abs(case.q), hkv)}
    base = gradient_baseline_error(case)
    c_max = T.spec.tolerances()["gradient"]["c_max"]
    return _judge_gradients_with(entry, case, res, masks, {n: base[n] + gamma * add / c_max for n, add in extra.items()},
                                 "weights recomputed in float32")


def _judge_gradients_with(entry, case, res, masks, allowance: dict[str, np.ndarray], what: str) -> Verdict:
    """Each covered gradient under the gradient model with `allowance` in place of the baseline's error."""
    from attnconf.reference.backward import backward

    ref = backward(case)
    mags = T.gradient_magnitudes(case)
    for name, base in allowance.items():
        if name not in masks or name not in res.grads:
            continue
        r = getattr(ref, name)
        j = T.judge_arrays(np.broadcast_to(res.grads[name], r.shape), r, base, case.dtype,
                           quantity=f"{name} ({what})", model="gradient", magnitude=mags[name], mask=masks[name],
                           factor=_bound(entry))
        if not j.ok:
            return _judged(j)
    return Verdict(True)


@alternative("half_accumulation", ("out", "layer"), numeric=True, takes_bound=True)
def _half_accumulation(entry, case, res, masks) -> Verdict:
    """`bound` x c_max x the error of a naive implementation whose dot products accumulate in the case's
    own half type (rounded after every addition; the largest over the summation orders and scalings of
    half_accumulation_error), plus the floor. For a layer, its projections accumulate in the half type too
    (reference.layer.layer_half_accumulation_error)."""
    from attnconf.reference import baseline_error
    from attnconf.reference.emulate import half_accumulation_error

    if hasattr(case, "num_heads"):
        from attnconf.reference.layer import layer_baseline_error, layer_half_accumulation_error

        with np.errstate(invalid="ignore"):
            base = np.maximum(layer_half_accumulation_error(case), layer_baseline_error(case))
        return _judged(T.judge_layer(res.out, case, mask=masks.get("out"), base_err=base, factor=_bound(entry)))
    ref = oracle(case).out
    with np.errstate(invalid="ignore"):
        base = np.maximum(half_accumulation_error(case), baseline_error(case)[0])
    return _judged(T.judge_arrays(np.asarray(res.out), ref, base, case.dtype, quantity="out (half accumulation)",
                                  mask=masks["out"], factor=_bound(entry)))


@alternative("half_accumulation_gradients", GRADIENTS, numeric=True, takes_bound=True)
def _half_accumulation_gradients(entry, case, res, masks) -> Verdict:
    """`bound` x c_max x the error of the backward of a naive implementation whose dot products (the
    forward's Q K^T included) accumulate in the case's own half type (the largest over the summation orders
    and scalings of emulate_half_backward.half_accumulation_gradient_error), or the gradient baseline's
    where larger, plus the floor: `half_accumulation` for gradients."""
    from attnconf.reference.emulate_backward import gradient_baseline_error
    from attnconf.reference.emulate_half_backward import half_accumulation_gradient_error

    if case.dtype not in ("float16", "bfloat16") or case.grad_out is None or not res.grads:
        return Verdict(False, "half_accumulation_gradients describes float16 and bfloat16 gradients only")
    half, base = half_accumulation_gradient_error(case), gradient_baseline_error(case)
    return _judge_gradients_with(entry, case, res, masks, {n: np.maximum(half[n], base[n]) for n in half},
                                 "half accumulation")


def half_accumulated(applied: list) -> frozenset[str]:
    """The gradients that an applied entry declares half-accumulated (`half_accumulation_gradients`): where
    another entry covers the same elements (a row region covers every dK and dV its rows reach), its
    alternative judges them with that error too, as `precision_of` passes a declared lower precision on."""
    return frozenset(q for a in applied if a.instead == "half_accumulation_gradients" for q in a.entry["quantities"])


# ---- the reference of a nearby problem --------------------------------------------------

def _judge_against(alt: Case, case: Case, res, masks) -> Verdict:
    if "out" in masks:
        j = T.judge_output(np.asarray(res.out), alt, mask=masks["out"])
        if not j.ok:
            return _judged(j)
    if "lse" in masks and res.lse is not None:
        j = T.judge_lse(np.asarray(res.lse), alt, mask=masks["lse"])
        if not j.ok:
            return _judged(j)
    if res.grads and any(g in masks for g in GRADIENTS) and alt.grad_out is not None:
        for j in T.judge_gradients({n: np.asarray(g) for n, g in res.grads.items()}, alt,
                                   masks={n: m for n, m in masks.items() if n in GRADIENTS}):
            if not j.ok:
                return _judged(j)
    return Verdict(True)


@alternative("scale_float32", FORWARD + GRADIENTS + ("layer",), numeric=True)
def _scale_float32(entry, case, res, masks) -> Verdict:
    """The reference with the scale in float32 (as Keras computes it), under the float64 bound."""
    if hasattr(case, "num_heads"):
        from attnconf.reference import forward
        from attnconf.reference.layer import mha

        s32 = float(np.float32(1.0 / np.sqrt(case.head_dim)))
        expected = mha(case, lambda q, k, v, **kw: forward(q, k, v, scale=s32, **kw).out)
        return _judged(T.judge_layer(res.out, case, mask=masks["out"], ref=expected))
    return _judge_against(scale_float32_case(case), case, res, masks)


def scale_float32_case(case: Case) -> Case:
    """The case with the scale as Keras computes it in float32: the default 1 / sqrt(float32(Dk)) (two
    float32 roundings, which can differ from float32(1 / sqrt(Dk)) by one ulp: Dk = 72, measured), a
    given scale cast once. Other entries' alternatives are judged on it where this one applies too."""
    s32 = np.float32(1.0) / np.sqrt(np.float32(case.shape["Dk"])) if case.scale is None else np.float32(case.scale)
    return case.replace(scale=float(s32))


@alternative("finite_mask_bias", FORWARD + GRADIENTS, numeric=True)
def _finite_mask_bias(entry, case, res, masks) -> Verdict:
    """The reference with the keys that the kernel receives as a boolean mask given the finite bias
    `value` instead of -inf (see finite_mask_bias_case)."""
    return _judge_against(finite_mask_bias_case(case, float(entry["value"]), entry.get("finite_for")), case, res, masks)


FINITE_SOURCES = ("mask", "causal", "window", "q_lengths", "kv_lengths")


def finite_mask_bias_case(case: Case, value: float, finite_for: list[str] | None = None) -> Case:
    """The case as a kernel computes it that turns what hides keys into one boolean mask and adds that
    mask as the finite bias `value`: a hidden key's logit becomes float32(logit + value), carried as an
    unrounded float64 bias. With -32768 the logits' differences survive (a row that sees no key attends over
    its hidden keys); with -2**41 in bfloat16 they do not (uniform weights: the mean of V over those
    keys). `finite_for` names which of FINITE_SOURCES the kernel receives in that mask (default all: an
    SDPA-convention call folds mask, causal alignment, window and padding together); the others, and a
    -inf bias, hide keys as the spec says."""
    srcs = set(FINITE_SOURCES if finite_for is None else finite_for)
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    from attnconf.reference import visibility

    lengths = {"q_lengths": case.q_lengths, "kv_lengths": case.kv_lengths}
    padded = ~visibility(full, **lengths)

    def hidden_by(name: str) -> np.ndarray:
        if name == "mask":
            return ~visibility(full, mask=case.mask)
        if name in lengths:
            return ~visibility(full, **{name: lengths[name]})
        # causal alignment and windows sit where the lengths put them (bottom-right: at each sequence's end)
        extra = {"causal": case.causal} if name == "causal" else {"window": case.window, "window_align": case.window_align}
        return ~visibility(full, **extra, **lengths) & ~padded
    present = [n for n in FINITE_SOURCES if n in srcs and getattr(case, n) is not None]
    hidden = np.zeros(full, dtype=bool)
    for name in present:
        hidden |= hidden_by(name)
    if not hidden.any():
        return case
    logits = oracle(case).logits
    ok = hidden & np.isfinite(logits)
    s_ok = np.where(ok, logits, 0.0)
    shift = np.where(ok, np.asarray(np.float32(s_ok + value), dtype=np.float64) - s_ok, 0.0)
    bias = shift if case.bias is None else np.broadcast_to(case.bias, full) + shift
    # not Case.replace: it would round the bias to the case's dtype, and a bias of -2**41 - logit rounded
    # to bfloat16 is -2**41 again, which gives the logits' differences back in the float64 reference
    alt = dataclasses.replace(case, bias=bias, _cache={}, **dict.fromkeys(present))
    alt.validate()
    return alt


@alternative("unmasked", FORWARD)
def _unmasked(entry, case, res, masks) -> Verdict:
    """The reference with the boolean mask ignored (on the covered rows)."""
    return _judge_against(case.replace(mask=None), case, res, masks)


# ---- alternatives given as the expected values of every element --------------------------------

def expected_values(name: str, fn: Callable[[Case], dict[str, np.ndarray]], *, numeric: bool = False) -> None:
    """Register an alternative from a function that returns, for a case, the expected float64 value of
    every element of each quantity it defines (NaN = the element must be NaN). Covered elements are
    judged against those values with the tolerance model of the case's dtype: the spec's yardstick
    (the naive baseline's error) and a floor taken at the larger of the two magnitudes. Where the
    output is a weighted sum of V whose weights `fn` also returns (as "out_weights"), the yardstick is
    at least the naive error of that sum in the dtype: on a row whose reference output is 0 (an empty
    row) the spec's baseline is 0, while averaging many values costs rounding of its own."""
    def check(entry, case, res, masks) -> Verdict:
        exp = fn(case)
        for q, m in masks.items():
            if q not in exp:
                continue
            actual = getattr(res, q) if q in FORWARD else (res.grads or {}).get(q)
            if actual is None:
                continue
            e = np.asarray(exp[q], dtype=np.float64)
            a = np.broadcast_to(np.asarray(actual, dtype=np.float64), e.shape)
            v = _exact(q, a, m & np.isnan(e), np.isnan, "NaN")
            if not v.ok:
                return v
            extra = None
            if q == "out" and "out_weights" in exp and case.dtype != "float64":
                extra = np.nan_to_num(_weighted_sum_error(exp["out_weights"], e, case), nan=0.0, posinf=0.0)
            j = _judge_expected(a, e, case, q, m & ~np.isnan(e), extra)
            if not j.ok:
                return _judged(j)
        return Verdict(True)

    ALTERNATIVES[name] = Alternative(name, FORWARD + GRADIENTS, check, numeric)


def _weighted_sum_error(w: np.ndarray, expected: np.ndarray, case: Case, dtype: str | None = None) -> np.ndarray:
    """|naive(w @ V) - expected|, w and the sum rounded to `dtype` (the case's) as the naive baseline rounds them."""
    v = expand_kv(case.v, case.shape["Hq"])
    r, f32 = _rounder(dtype or case.dtype), np.float32
    with np.errstate(all="ignore"):
        naive = r(seq_matmul(r(np.asarray(w).astype(f32)), np.where(np.isfinite(v), v, 0.0).astype(f32), "ascending"))
    return np.abs(naive.astype(np.float64) - expected)


def _judge_expected(actual: np.ndarray, expected: np.ndarray, case: Case, quantity: str, mask: np.ndarray,
                    extra_base: np.ndarray | None = None):
    from attnconf.reference import baseline_error, oracle

    if quantity in FORWARD:
        ref = getattr(oracle(case), quantity)
        base = baseline_error(case)[0 if quantity == "out" else 1] if case.dtype != "float64" else None
        model = "forward"
    else:
        from attnconf.reference.backward import backward

        ref = getattr(backward(case), quantity)
        base = None
        if case.dtype != "float64":
            from attnconf.reference.emulate_backward import gradient_baseline_error

            base = gradient_baseline_error(case)[quantity]
        model = "gradient"
    with np.errstate(invalid="ignore"):
        mag = np.maximum(np.abs(np.nan_to_num(ref)), np.abs(np.nan_to_num(expected)))
    if case.dtype == "float64":
        a, vmax = T._logit_magnitude(case)
        ka, kc = T._float64_terms(case)
        tol = T.spec.tolerances()["float64"]["gamma"] * T.EPS64 * (ka * float(a.max(initial=0)) + kc + case.shape["Dv"])
        bound = tol * np.maximum(mag, np.broadcast_to(np.abs(expected).max(initial=0), mag.shape))
        with np.errstate(invalid="ignore"):
            bad = mask & ~(np.abs(actual - expected) <= bound)
        ok = not bad.any()
        j = T.Judgement(ok, quantity, "float64", 0, 0, 0, 0, 0, 0, 0, 0, 0)
        if not ok:
            idx = _first(bad)
            j.reason = f"{quantity} (float64) at {idx}: {actual[idx]:.17g}, expected {expected[idx]:.17g}"
        return j
    base = np.broadcast_to(base, expected.shape)
    if extra_base is not None:
        base = np.maximum(base, extra_base)
    return T.judge_arrays(actual, expected, base, case.dtype, quantity=quantity,
                          model=model, magnitude=mag, mask=mask)


def load_all() -> None:
    """Import every registered backend pack's `alternatives` module (their @alternative functions register)."""
    import importlib

    from attnconf.adapters.registry import pack_modules

    for module_name in pack_modules("alternatives"):
        module = importlib.import_module(module_name)
        # a module may also list expected-value functions under ALTERNATIVES (name -> fn(case))
        for name, fn in getattr(module, "ALTERNATIVES", {}).items():
            if name not in ALTERNATIVES:
                expected_values(name, fn)


def check(entry: dict[str, Any], case, res, masks: dict[str, np.ndarray], *, as_dtype: str | None = None,
          half_accumulated: frozenset[str] = frozenset()) -> Verdict:
    """Judge the covered elements of `res` against the entry's alternative; elements that conform to
    the spec itself are accepted as well (the implementation may have improved). `as_dtype` judges a
    float64 case at another precision (an implementation another entry declares float32-accurate);
    `half_accumulated` names the gradients that another applied entry declares half-accumulated, which
    an alternative computing expected gradients (uniform_weight_gradients) judges with that error."""
    alt = ALTERNATIVES[entry["instead"]]
    if not masks:
        return Verdict(True)
    if as_dtype is not None:
        entry = {**entry, "_as_dtype": as_dtype}
    if half_accumulated:
        entry = {**entry, "_half_accumulated": half_accumulated}
    v = alt.check(entry, case, res, masks)
    if v.ok:
        return v
    if conforms(case, res, masks):
        return Verdict(True, "conforms to the spec here")
    return Verdict(False, f"does not behave as declared (instead = {entry['instead']!r}): {v.detail}")


def conforms(case, res, masks: dict[str, np.ndarray]) -> bool:
    """Whether the covered elements conform to the spec (the normal tolerance model)."""
    if hasattr(case, "num_heads"):
        return T.judge_layer(np.asarray(res.out), case, mask=masks.get("out")).ok
    if "out" in masks and not T.judge_output(np.asarray(res.out), case, mask=masks["out"]).ok:
        return False
    if "lse" in masks and res.lse is not None and not T.judge_lse(np.asarray(res.lse), case, mask=masks["lse"]).ok:
        return False
    if "weights" in masks and getattr(res, "weights", None) is not None:
        s = case.shape      # the weights are the output of the same case with V the identity (Dv = Lk)
        eye = np.broadcast_to(np.eye(s["Lk"]), (s["B"], s["Hkv"], s["Lk"], s["Lk"]))
        if not T.judge_output(np.asarray(res.weights, np.float64), case.replace(v=eye, grad_out=None),
                              mask=masks["weights"]).ok:
            return False
    if res.grads and case.grad_out is not None and any(g in masks for g in GRADIENTS):
        js = T.judge_gradients({n: np.asarray(g) for n, g in res.grads.items()}, case,
                               masks={n: m for n, m in masks.items() if n in GRADIENTS})
        if not all(j.ok for j in js):
            return False
    return True
