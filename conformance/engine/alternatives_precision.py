"""Alternatives that judge at another precision or with another bound: the tolerance model of a lower
precision (float32_precision, ...), the spec's own model times the entry's `bound`, a backward that
recomputes the weights in float32, and dot products accumulated in the half type (forward and gradients).
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives_registry import (ALTERNATIVES, FORWARD, GRADIENTS, Alternative, Verdict,
                                                                _bound, _judged, alternative)
from attnconf.reference import expand_kv, oracle

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
