"""Custom scales for APIs that fix the scale at 1/sqrt(Dk) (flax linen, equinox): drive it through Q.

Such an API computes (Q / r) K^T with r = sqrt(Dk) rounded to the input dtype (flax:
`query / jnp.sqrt(depth).astype(dtype)`; equinox: `query / math.sqrt(qk_size)`, a Python float
that JAX rounds to the array's dtype). To express a case's scale s, the adapter passes
Q' = Q * c with c = s * r, and the API's own division gives Q' / r = s Q: its one rounding there
is the same as when it applies its default scale.

The translation is used only where it is exact, so that it adds no rounding the implementation
would not do itself (measured: an inexact Q * c in float16, Dk = 40, s = 0.5, near-tied logits of
2409.1 and 2409.5, failed ATTN-TOL-1 with ratio 2.64 while flax on the Q' it was given conformed):
c = s * r must hold exactly, c must be a power of two (so Q * c is exact in float64), and every
Q * c must be representable in the case's dtype (no overflow, no bits lost below the normal
range). Other custom scales are refused with that reason. dQ of the API is the gradient with
respect to Q', so the adapter multiplies it by c (exact: a power of two).
No framework import here: both backends share it.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Literal

import numpy as np

from attnconf.reference import Case, numpy_dtype, round_to


def rounded_sqrt(dk: int, dtype: str) -> float:
    """sqrt(Dk) as the API divides by it: the float64 square root rounded to the dtype."""
    return float(round_to(np.sqrt(np.float64(dk)), dtype))


def q_multiplier(case: Case) -> float:
    """c: the factor Q is multiplied by so that the API's fixed division by sqrt(Dk) yields the case's scale."""
    if case.scale is None:
        return 1.0
    return float(case.scale) * rounded_sqrt(case.shape["Dk"], case.dtype)


def scaled_query(case: Case) -> tuple[np.ndarray, float]:
    """(Q * c as float64 (exact wherever `scale_reason` is True); c)."""
    c = q_multiplier(case)
    if c == 1.0:
        return case.q, c
    return case.q * c, c


def scale_reason(case: Case, name: str) -> Literal[True] | str:
    """True, or why a custom scale cannot be expressed exactly through Q in the case's dtype."""
    if case.scale is None:
        return True
    s = float(case.scale)
    r = rounded_sqrt(case.shape["Dk"], case.dtype)
    c = q_multiplier(case)
    head = f"{name} has no scale argument; the custom scale {s:g} would reach it as Q * {c:.6g}"
    if Fraction(c) != Fraction(s) * Fraction(r):
        return f"{head}, and {s:g} * sqrt({case.shape['Dk']}) is not exact in float64"
    if c != 0.0 and abs(np.frexp(c)[0]) != 0.5:
        return f"{head}, which is not a power of two: the product would add a rounding of Q"
    with np.errstate(over="ignore", invalid="ignore"):
        q = case.q * c
        if not np.array_equal(round_to(q, case.dtype), q):
            return f"{head}, which is not exact in {case.dtype} (overflow or bits lost below the normal range)"
    return True


def scale_note(case: Case) -> dict[str, str]:
    c = q_multiplier(case)
    if c == 1.0:
        return {}
    return {"scale": f"custom scale {case.scale:g} driven through Q: Q * {c:g} (exact), which the API divides "
                     f"by sqrt({case.shape['Dk']})"}
