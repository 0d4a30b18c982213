"""What an implementation does instead, inside a divergence's region: computed and checked.

Each divergence entry names its behaviour with `instead` (spec/divergences/README.md); this
module computes what that behaviour gives on a case and judges the covered elements of a result
against it. An element that conforms to the spec itself is always accepted too: an implementation
that got better is not a failure (its entry is then reported stale by the witness check).

Every check returns a `Verdict`: ok, a one-line detail, and the ratio of error to allowance.

The alternatives live in modules by kind; this module is their face (every name the engine, the
backends' alternatives_<backend>.py and the tests use is importable from here), loads them all in their
registration order, and judges an entry (`check`, `conforms`):

- alternatives_registry: `Verdict`, `Alternative`, the registry `ALTERNATIVES`, `@alternative`, helpers;
- alternatives_rows: exact values per element or row, and the uniform weights of a finite mask fill;
- alternatives_precision: another precision, another bound, half accumulation;
- alternatives_nearby: the spec on a nearby problem (float32 scale, finite mask bias, no mask);
- alternatives_expected: alternatives given as every element's expected value.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives_registry import (
    ALTERNATIVES, FORWARD, GRADIENTS, Alternative, Verdict, _bound, _exact, _first, _judged, alternative)
from attnconf.conformance.engine.alternatives_rows import uniform_weights
from attnconf.conformance.engine.alternatives_precision import PRECISION_ORDER, PRECISIONS, half_accumulated
from attnconf.conformance.engine.alternatives_nearby import (
    FINITE_SOURCES, _judge_against, finite_mask_bias_case, scale_float32_case)
from attnconf.conformance.engine.alternatives_expected import expected_values

__all__ = ["ALTERNATIVES", "FINITE_SOURCES", "FORWARD", "GRADIENTS", "PRECISIONS", "PRECISION_ORDER", "Alternative",
           "T", "Verdict", "_bound", "_exact", "_first", "_judge_against", "_judged", "alternative", "check", "conforms",
           "expected_values", "finite_mask_bias_case", "half_accumulated", "load_all", "scale_float32_case",
           "uniform_weights"]


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
