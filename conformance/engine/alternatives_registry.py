"""The vocabulary of divergence alternatives: the `Verdict` every check returns, the `Alternative` record, the
registry `ALTERNATIVES` that the `@alternative` decorator fills (the modules alternatives_rows, _precision,
_nearby and a backend's alternatives_<backend>.py register into it), and the element helpers they share.

Kept apart from the alternatives themselves so that a backend's module and the engine's declared.py can
register one without importing every other (attnconf.conformance.engine.alternatives is the face that
loads them all).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

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
