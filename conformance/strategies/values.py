"""The numbers inside a case: q, k and v of a value regime, scales, ALiBi slopes and sink logits.

The array values come from a NumPy generator seeded by a drawn seed (so they are cheap and a case replays
from its seed); only the regime, the seed and the few discrete choices are drawn by Hypothesis.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import offer
from attnconf.reference import Case


# how large and how alike the logits and outputs are (`values`)
REGIMES = ("ordinary", "large", "overflow", "mixed", "near_ties", "large_values")
# the largest finite magnitude a test plants in an input of each dtype
FINITE_MAX = {"float64": 1e30, "float32": 1e30, "bfloat16": 1e30, "float16": 6e4}


def values(rng: np.random.Generator, s: dict[str, int], regime: str, dtype: str):
    """q, k, v (float64) for a value regime."""
    b, hq, hkv, lq, lk, dk, dv = (s[n] for n in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv"))
    q = rng.normal(size=(b, hq, lq, dk))
    k = rng.normal(size=(b, hkv, lk, dk))
    v = rng.normal(size=(b, hkv, lk, dv))
    if regime == "large":          # scaled logits up to about 1e4
        target = 10 ** rng.uniform(2.5, 3.5)
        a = np.sqrt(target)
        q, k = q * a, k * a
    elif regime == "overflow":     # logits ~ 50..200: exp() overflows fp16/bf16/fp32 without max-subtraction
        a = np.sqrt(rng.uniform(60, 200) / 1.0)
        q, k = q * a, k * a
    elif regime == "mixed":        # rows whose logit ranges differ by orders of magnitude
        q = q * 10.0 ** rng.uniform(-3, 2, size=(b, hq, lq, 1))
    elif regime == "near_ties":    # nearly identical keys and a sharp query: near-equal top logits
        k = k[:, :, :1, :] + 1e-3 * rng.normal(size=k.shape)
        q = q * 10.0
    elif regime == "large_values" and dtype != "float16":
        # outputs far from O(1), past float16's range (65504): a bfloat16 or float32 result stored through a
        # float16 buffer overflows. Not in float16 itself, whose range leaves no room: the baseline's own
        # dO V^T (and a correct kernel's dbias) would overflow there.
        v = v * 10.0 ** rng.uniform(4.5, 6.0)
    if dtype == "float16":         # keep q * scale and logits inside fp16's range
        q = np.clip(q, -3e4, 3e4)
    return q, k, v


# explicit scales beside the default 1/sqrt(Dk) (two_key_cases, convention_cases)
CUSTOM_SCALES = (0.5, 1.0, 0.125, 2.0, 0.01, 0.3)


def geometric_slopes(hq: int) -> np.ndarray:
    """The ALiBi paper's schedule: 2^(-8 i / n) for i = 1..n with n = Hq when Hq is a power of two; otherwise
    n is the power of two below Hq and the remaining Hq - n heads take every other slope of the 2n schedule
    (the rule of the paper's reference code, which models are trained with)."""
    n = 1 << (max(hq, 1).bit_length() - 1)
    base = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    extra = (2.0 ** (-8.0 * np.arange(1, 2 * n + 1) / (2 * n)))[0::2][:hq - n]
    return np.concatenate([base, extra])


ALIBI_SLOPE_KINDS = ("paper", "geometric", "uniform", "with_zero", "steep", "negative", "mixed_sign")


def slopes_of_kind(kind: str, hq: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Slopes of `shape` (last axis Hq). The spec allows any finite slope (ATTN-ALIBI-1), so beside the
    trained schedules (paper: 2^(-8h/Hq) as written; geometric: the reference code's rule for any Hq) come
    slopes above 1 (steep: up to 8, where a row sees its diagonal key only), negative ones (the bias then
    grows with distance: far keys dominate) and both signs in one call."""
    if kind in ("paper", "geometric"):
        row = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq) if kind == "paper" else geometric_slopes(hq)
        return np.broadcast_to(row, shape).copy()
    if kind == "steep":
        return rng.uniform(1.0, 8.0, shape)
    sl = rng.uniform(0.0, 1.0, shape)
    if kind == "negative":
        return -sl
    if kind == "mixed_sign":
        return sl * rng.choice((-1.0, 1.0), shape)
    if kind == "with_zero":
        sl.reshape(-1)[int(rng.integers(sl.size))] = 0.0
    return sl


@st.composite
def alibi_slopes(draw, case: Case) -> np.ndarray:
    """Slopes of shape (Hq,) or (B, Hq), of one of ALIBI_SLOPE_KINDS (slopes_of_kind)."""
    b, hq = case.shape["B"], case.shape["Hq"]
    shape = draw(st.sampled_from(((hq,), (b, hq))))
    rng = np.random.default_rng(case.seed + 3)
    return slopes_of_kind(draw(st.sampled_from(ALIBI_SLOPE_KINDS)), hq, shape, rng)


SINK_OFFSETS = (-40.0, -5.0, -1.0, 0.0, 1.0, 5.0, 40.0)


@st.composite
def sink_values(draw, case: Case) -> np.ndarray:
    """Per-head sinks placed against the heads' typical lse: far below (no effect), comparable, or far
    above (the sink dominates and scales rows by ~exp(lse - sink)); 0-centred when no row sees a key."""
    offer("sinks")
    from attnconf.reference import oracle

    base = oracle(case.replace(sinks=None)).lse
    hq = case.shape["Hq"]
    centre = np.zeros(hq)
    for h in range(hq):
        fin = base[:, h][np.isfinite(base[:, h])]
        centre[h] = float(np.median(fin)) if fin.size else 0.0
    offsets = np.array([draw(st.sampled_from(SINK_OFFSETS)) for _ in range(min(hq, 4))])
    sinks = centre + np.resize(offsets, hq)
    if case.dtype == "float16":
        sinks = np.clip(sinks, -6e4, 6e4)
    return sinks
