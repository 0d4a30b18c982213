"""NaN-aware distances between two arrays, for the comparisons the suite makes (ATTN-TOL-3).

A NaN-ignoring reduction (np.nanmax and friends) reports the distance of the finite entries only, so
a NaN where the other side is finite would read as "close". Here it reads as infinitely far: the
distance at a position is |a - b| where both are finite, 0 where both hold the same non-finite value
(NaN and NaN, inf and inf of one sign: the same answer, as `np.array_equal(..., equal_nan=True)` says),
and inf everywhere else. tests/test_nan_aware.py keeps NaN-ignoring reductions out of the project.
"""
from __future__ import annotations

import numpy as np


def gap(a, b, nan_equal: bool = True) -> np.ndarray:
    """Elementwise NaN-aware |a - b| (float64), as the module docstring defines it. With nan_equal=False a
    NaN is far from everything, another NaN included: for "did this output move?", where a NaN row must
    count as moved (then the output checks judge it), never as unchanged (ATTN-ARG-1)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    same = ((np.isnan(a) & np.isnan(b)) if nan_equal else False) | (~fa & ~fb & (a == b))
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(np.where(fa & fb, a - b, 0.0))
    return np.where(fa & fb, d, np.where(same, 0.0, np.inf))


def max_gap(a, b, axis: int | None = None, nan_equal: bool = True):
    """The largest NaN-aware |a - b| (0 for empty arrays); a float, or an array when `axis` is given."""
    d = gap(a, b, nan_equal)
    m = d.max(axis=axis, initial=0.0)
    return float(m) if axis is None else m


def max_abs(a) -> float:
    """The largest |a|, inf when any entry is NaN or infinite (0 for an empty array)."""
    a = np.asarray(a, dtype=np.float64)
    if not np.isfinite(a).all():
        return float("inf")
    return float(np.abs(a).max(initial=0.0))
