"""Alternatives given as the expected value of every element (a backend's alternatives_<backend>.py lists
such functions; alternatives.load_all registers them), judged with the tolerance model of the case's dtype.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives_registry import (ALTERNATIVES, FORWARD, GRADIENTS, Alternative, Verdict,
                                                                _exact, _first, _judged)
from attnconf.conformance.engine.alternatives_rows import _weighted_sum_error
from attnconf.reference import Case

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
            bad = mask & ~(np.abs(actual - expected) <= bound + T.TINY64)
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
