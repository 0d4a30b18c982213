"""Every Hypothesis strategy of the suite: cases that reach the corners where kernels break.

Shapes, masks, dtypes and value regimes are drawn by Hypothesis (so they
shrink); the array values come from a NumPy generator seeded by a drawn seed
(so they are cheap and a case replays from its seed). Sizes are bounded so
that one example costs milliseconds on a 2-core CPU: the product
B * Hq * Lq * Lk * (Dk + Dv) stays under BUDGET.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from reference import DTYPES, Case

BUDGET = 1_500_000
# Lengths where tiled kernels break: 1, small primes, 2^k +- 1, = 1 mod 16/32/64/128, several blocks.
SMALL_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 31, 32, 33)
MEDIUM_LENGTHS = (47, 63, 64, 65, 81, 97, 113, 127, 128, 129)
LARGE_LENGTHS = (193, 255, 257, 300, 385)
HEAD_DIMS = (8, 16, 4, 1, 2, 3, 5, 32, 40, 64, 72, 80, 96, 104, 128, 160, 200, 256)
GROUPS = (1, 2, 4, 8)
REGIMES = ("ordinary", "large", "overflow", "mixed", "near_ties")
FINITE_MAX = {"float64": 1e30, "float32": 1e30, "bfloat16": 1e30, "float16": 6e4}


@st.composite
def lengths(draw, max_len: int = 385) -> int:
    pool = draw(st.sampled_from(("small", "small", "small", "medium", "large")))
    choices = {"small": SMALL_LENGTHS, "medium": MEDIUM_LENGTHS, "large": LARGE_LENGTHS}[pool]
    return draw(st.sampled_from([n for n in choices if n <= max_len] or [1]))


@st.composite
def shapes(draw, *, gqa: bool = True, cross: bool = True, dv_ne_dk: bool = True, max_len: int = 385,
           same_d: bool = False) -> dict[str, int]:
    lq = draw(lengths(max_len))
    lk = draw(lengths(max_len)) if cross and draw(st.booleans()) else lq
    dk = draw(st.sampled_from(HEAD_DIMS))
    dv = draw(st.sampled_from(HEAD_DIMS)) if dv_ne_dk and not same_d and draw(st.integers(0, 3)) == 0 else dk
    hkv = draw(st.sampled_from((1, 2, 1, 3)))
    group = draw(st.sampled_from(GROUPS)) if gqa else 1
    b = draw(st.sampled_from((1, 2, 3)))
    hq = hkv * group
    while b * hq * lq * lk * (dk + dv) > BUDGET and (b > 1 or hq > 1):
        if b > 1:
            b -= 1
        elif hkv > 1:
            hkv -= 1
            hq = hkv * group
        else:
            group = max(1, group // 2)
            hq = hkv * group
    if b * hq * lq * lk * (dk + dv) > BUDGET:
        dk = dv = 8
    return {"B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dv}


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
    if dtype == "float16":         # keep q * scale and logits inside fp16's range
        q = np.clip(q, -3e4, 3e4)
    return q, k, v


@st.composite
def mask_params(draw, rng: np.random.Generator, s: dict[str, int], *, causal: bool = True, masks: bool = True,
                padding: bool = True, bias: bool = True, empty_rows: bool = True) -> dict:
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    p: dict = {}
    if causal:
        p["causal"] = draw(st.sampled_from((None, None, "top_left", "bottom_right")))
    if masks and draw(st.integers(0, 2)) == 0:
        density = draw(st.sampled_from((0.5, 0.9, 0.1)))
        mshape = draw(st.sampled_from(((b, 1, lq, lk), (1, 1, lq, lk), (b, hq, lq, lk), (lq, lk), (b, 1, 1, lk))))
        m = rng.random(mshape) < density
        if empty_rows and mshape[-2] == lq and draw(st.integers(0, 3)) == 0:
            m[..., int(rng.integers(lq)), :] = False     # a fully-masked row
        p["mask"] = m
    if bias and draw(st.integers(0, 3)) == 0:
        bshape = draw(st.sampled_from(((b, hq, lq, lk), (1, hq, lq, lk), (b, 1, lq, lk), (lq, lk))))
        bias_ = rng.normal(size=bshape) * draw(st.sampled_from((1.0, 3.0)))
        if draw(st.booleans()):
            bias_[rng.random(bshape) < 0.2] = -np.inf
        p["bias"] = bias_
    if padding and draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(0 if empty_rows else 1, lk + 1, size=b)
        if draw(st.booleans()):
            p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
    return p


@st.composite
def cases(draw, *, dtypes: tuple[str, ...] = DTYPES, regimes: tuple[str, ...] = REGIMES, causal: bool = True,
          masks: bool = True, padding: bool = True, bias: bool = True, empty_rows: bool = True, gqa: bool = True,
          cross: bool = True, dv_ne_dk: bool = True, same_d: bool = False, custom_scale: bool = True,
          layouts: bool = True, grad: bool = False, max_len: int = 385) -> Case:
    """A validated Case anywhere in the spec's domain (restrict with the keyword switches)."""
    s = draw(shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk, max_len=max_len, same_d=same_d))
    dtype = draw(st.sampled_from(dtypes))
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    params = draw(mask_params(rng, s, causal=causal, masks=masks, padding=padding, bias=bias, empty_rows=empty_rows))
    if custom_scale and draw(st.integers(0, 4)) == 0:
        params["scale"] = draw(st.sampled_from((0.5, 1.0, 0.125, 2.0, 0.01)))
    layout = "contiguous"
    if layouts:
        layout = draw(st.sampled_from(("contiguous", "contiguous", "contiguous", "noncontiguous", "broadcast_kv")))
        if layout == "broadcast_kv":
            k = np.broadcast_to(k[:1], k.shape).copy()
            v = np.broadcast_to(v[:1], v.shape).copy()
    if grad:
        params["grad_out"] = rng.normal(size=(s["B"], s["Hq"], s["Lq"], s["Dv"]))
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **params)


def visible_rows_only(case: Case) -> bool:
    """Every query row sees at least one key."""
    from reference import oracle

    return bool(oracle(case).visible.any(axis=-1).all())


def fixed_case(seed: int = 0, *, B=1, Hq=2, Hkv=None, Lq=5, Lk=7, Dk=8, Dv=None, dtype="float32", **params) -> Case:
    """A small deterministic case for @example pins and witnesses."""
    rng = np.random.default_rng(seed)
    s = {"B": B, "Hq": Hq, "Hkv": Hkv or Hq, "Lq": Lq, "Lk": Lk, "Dk": Dk, "Dv": Dv or Dk}
    q, k, v = values(rng, s, params.pop("regime", "ordinary"), dtype)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **params)
