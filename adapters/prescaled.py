"""Custom scales for APIs that fix the scale at 1/sqrt(Dk) (flax linen, equinox): drive it through Q.

Such an API computes (Q / sqrt(Dk)) K^T. To express a case's scale s, the adapter passes
Q * (s * sqrt(Dk)) instead, computed in float64 and rounded once to the case's dtype; the API's own
division by sqrt(Dk) then yields s Q K^T up to that one extra rounding, which belongs to the
translation (the tolerance model's envelope already includes a variant that scales Q in the dtype).
A case whose scaled Q would overflow the dtype cannot be expressed and is refused. dQ of the API is
the gradient with respect to the scaled Q, so the adapter multiplies it by the same factor (float64).
No framework import here: both backends share it.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from attnconf.reference import Case, numpy_dtype


def q_multiplier(case: Case) -> float:
    """The factor Q is multiplied by so that the API's fixed 1/sqrt(Dk) yields the case's scale."""
    return 1.0 if case.scale is None else float(case.scale) * float(np.sqrt(case.shape["Dk"]))


def scaled_query(case: Case) -> tuple[np.ndarray, float]:
    """(Q * multiplier rounded to the case's dtype, as float64; the multiplier)."""
    c = q_multiplier(case)
    if c == 1.0:
        return case.q, c
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.asarray(case.q * c).astype(numpy_dtype(case.dtype)).astype(np.float64)
    return q, c


def scale_reason(case: Case, name: str) -> Literal[True] | str:
    """True, or why a custom scale cannot be expressed through Q in the case's dtype."""
    if case.scale is None:
        return True
    q, c = scaled_query(case)
    if not np.isfinite(q).all():
        return (f"{name} has no scale argument; the custom scale {case.scale:g} is driven through Q, and "
                f"Q * {c:.6g} overflows {case.dtype}")
    return True


def scale_note(case: Case) -> dict[str, str]:
    c = q_multiplier(case)
    if c == 1.0:
        return {}
    return {"scale": f"custom scale {case.scale:g} driven through Q: Q * {c:.9g} rounded to {case.dtype}"}
