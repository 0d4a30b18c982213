"""Elements a declared divergence covers: judged against what the entry says the implementation does
instead (conformance/engine/alternatives.py), then replaced by the spec's own values and marked, so every
later check of the test judges the rest of the case as usual and none can be fooled or tripped by them.

The mark is the `Exempt` array subclass: `tolerance` leaves out an array's `exempt` elements, and a view
or the result of arithmetic carries no mark, so only the array the kernel returned is ever exempted.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from attnconf.adapters import Result
from attnconf.conformance.engine import alternatives
from attnconf.conformance.engine.outcomes import ConformanceFailure
from attnconf.conformance.engine.session import TestRecord


def precision_of(applied: list, case) -> str | None:
    """float32 when an applied entry says the implementation is float32-accurate on this float64 case:
    the other entries' alternatives are then judged at that precision too."""
    if getattr(case, "dtype", None) == "float64" and any(a.instead == "float32_precision" for a in applied):
        return "float32"
    order = alternatives.PRECISION_ORDER            # a declared compute_dtype below the case's dtype
    dtype = getattr(case, "dtype", None)
    lower = [alternatives.PRECISIONS[a.instead] for a in applied if a.instead in alternatives.PRECISIONS]
    return lower[0] if lower and dtype in order and order.index(lower[0]) < order.index(dtype) else None


def by_specificity(applied: list) -> list:
    """Entries with row regions first, then case regions, the catch-all region "any" last; among
    equals, NaN-like alternatives first (a NaN row makes every gradient element it reaches NaN)."""
    return sorted(applied, key=lambda a: (a.rows is None, a.entry["region"] == "any",
                                          a.instead not in ("nan", "nan_or_spec", "non_finite", "non_finite_or_spec")))


def judge_covered(rec: TestRecord, applied: list, case, res: Result, impl_name: str,
                  masks_of: Callable[[Any], dict[str, np.ndarray]],
                  check: Callable[[Any, dict[str, np.ndarray]], Any], *, handed_back: bool = True) -> dict[str, np.ndarray]:
    """Judge each applied entry on the elements it covers (an element belongs to the most specific entry
    that covers it); a broken entry fails its clause. Returns quantity -> elements judged here. With
    `handed_back`, an entry whose alternative handed every covered element back to the spec ("or spec")
    leaves them to be judged as usual."""
    exempt: dict[str, np.ndarray] = {}
    for a in by_specificity(applied):
        if a.instead in ("raises", "returns"):
            continue
        masks = {q: m & ~exempt[q] if q in exempt else m for q, m in masks_of(a).items()}
        if not any(m.any() for m in masks.values()):
            continue
        verdict = check(a, masks)
        if not verdict.ok:
            raise ConformanceFailure(a.entry["clause"], f"{a.id}: {verdict.detail}", case, impl_name)
        if handed_back and not any(m.any() for m in masks.values()):
            continue
        if verdict.detail:          # the covered elements conform to the spec itself: nothing diverged here
            rec.note_conformed_in_region(a.id)
        else:
            rec.note_divergent(a.id)
        for q, m in masks.items():
            exempt[q] = m if q not in exempt else exempt[q] | m
    return exempt


class Exempt(np.ndarray):
    """An output array whose `exempt` elements a divergence already judged (and set to the spec's values)."""

    exempt: np.ndarray | None = None

    def __array_finalize__(self, obj) -> None:
        self.exempt = None         # views and results of arithmetic carry no exemption


def mark(arr: np.ndarray, exempt: np.ndarray) -> Exempt:
    out = np.asarray(arr).view(Exempt)
    out.exempt = exempt
    return out


def substitute(res: Result, case, exempt: dict[str, np.ndarray]) -> None:
    """Put the spec's values into the covered elements (they are judged already) and mark them."""
    from attnconf.reference import oracle

    ref = oracle(case)
    if "out" in exempt:
        res.out = mark(np.where(exempt["out"], ref.out, res.out), exempt["out"])
    if "lse" in exempt and res.lse is not None:
        res.lse = mark(np.where(exempt["lse"], ref.lse, res.lse), exempt["lse"])
    if "weights" in exempt and getattr(res, "weights", None) is not None:
        res.weights = mark(np.where(exempt["weights"], ref.weights, res.weights), exempt["weights"])
    grads = {q: m for q, m in exempt.items() if q in alternatives.GRADIENTS}
    if grads and res.grads:
        from attnconf.reference.backward import backward

        g = backward(case)
        for q, m in grads.items():
            if q in res.grads and getattr(g, q) is not None:
                full = np.broadcast_to(res.grads[q], getattr(g, q).shape)
                res.grads[q] = mark(np.where(m, getattr(g, q), full), m)
