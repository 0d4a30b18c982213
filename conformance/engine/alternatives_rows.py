"""Alternatives that say what each covered element or row holds: an exact value (0, NaN, NaN or 0,
non-finite) or the uniform weights a mask applied as a large finite negative leaves (the mean of V over
the mask-hidden keys, forward and gradients).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives_registry import (FORWARD, GRADIENTS, Verdict, _exact, _first, _judged,
                                                                alternative)
from attnconf.reference import Case, expand_kv, oracle
from attnconf.reference.emulate import _rounder, seq_matmul

# ---- exact values --------------------------------------------------------------------

@alternative("zero", ("out",))
def _zero(entry, case, res, masks) -> Verdict:
    return _exact("out", res.out, masks["out"], lambda a: a == 0, "exactly 0")


@alternative("nan", FORWARD + GRADIENTS + ("weights",))
def _nan(entry, case, res, masks) -> Verdict:
    for q, m in masks.items():
        arr = getattr(res, q, None) if q in FORWARD + ("weights",) else (res.grads or {}).get(q)
        if arr is not None:
            v = _exact(q, np.broadcast_to(np.asarray(arr), m.shape), m, np.isnan, "NaN")
            if not v.ok:
                return v
    return Verdict(True)


@alternative("nan_or_spec", GRADIENTS)
def _nan_or_spec(entry, case, res, masks) -> Verdict:
    """Each covered gradient element is NaN, or the spec's value within the gradient tolerance: what the
    gradients of NaN rows give (a kernel's NaN empty rows, rows a float16 overflow made NaN). NaN reaches dV
    and dK through the row's weights; dQ of the row may be 0 where the masked logits were constants."""
    if not res.grads or case.grad_out is None:
        return Verdict(True)
    grads = {q: np.asarray(g) for q, g in res.grads.items()}
    finite = {q: m & ~np.isnan(np.broadcast_to(grads[q], m.shape)) for q, m in masks.items() if q in grads}
    for j in T.judge_gradients(grads, case, masks=finite):
        if not j.ok:
            return Verdict(False, j.explain())
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
            wrong = ~(np.abs(np.asarray(res.out) - expected) <= bound + T.TINY64)

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
            bad = masks[name] & ~(np.abs(g - exp) <= bound + T.TINY64)
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


def _weighted_sum_error(w: np.ndarray, expected: np.ndarray, case: Case, dtype: str | None = None) -> np.ndarray:
    """|naive(w @ V) - expected|, w and the sum rounded to `dtype` (the case's) as the naive baseline rounds them."""
    v = expand_kv(case.v, case.shape["Hq"])
    r, f32 = _rounder(dtype or case.dtype), np.float32
    with np.errstate(all="ignore"):
        naive = r(seq_matmul(r(np.asarray(w).astype(f32)), np.where(np.isfinite(v), v, 0.0).astype(f32), "ascending"))
    return np.abs(naive.astype(np.float64) - expected)
