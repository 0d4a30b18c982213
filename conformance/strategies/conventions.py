"""Calling-convention cases (varlen, paged KV cache, lse): the vocabulary modern kernels share.

Bottom-right causal, sliding windows, softcap, ALiBi, GQA, per-sequence lengths, and `packing` choices.
Tests fit them to the implementation's scope with conformance/engine/scope_fit.py.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import dtype_choice, limit
from attnconf.conformance.strategies.sizes import BUDGET, fit_lengths, lengths, palette_shapes
from attnconf.conformance.strategies.values import (ALIBI_SLOPE_KINDS, CUSTOM_SCALES, REGIMES, geometric_slopes,
                                                    slopes_of_kind, values)
from attnconf.reference import DTYPES, Case


CONV_HEAD_DIMS = (8, 16, 4, 32, 64, 1, 3, 40, 128)
WINDOW_BOUNDS = (-1, 0, 1, 2, 3, 7, 16)
SOFTCAPS = (0.5, 1.0, 5.0, 30.0, 50.0)
# the dtypes the lse strategies draw unless told: every dtype but float64
LSE_DTYPES = tuple(d for d in DTYPES if d != "float64")


def convention_alibi_slopes(rng: np.random.Generator, b: int, hq: int, how: str) -> np.ndarray:
    """ALiBi slopes: the paper's geometric schedule (geometric_slopes, any H), random in [0.01, 1], per
    (batch, head), or of another of ALIBI_SLOPE_KINDS (above 1, negative, both signs); float32 values (the
    flash-attention convention passes slopes as float32)."""
    if how == "geometric":
        slopes = geometric_slopes(hq)
    elif how == "batch":
        slopes = rng.uniform(0.01, 1.0, size=(b, hq))
    elif how in ALIBI_SLOPE_KINDS:
        slopes = slopes_of_kind(how, hq, (hq,), rng)
    else:
        slopes = rng.uniform(0.01, 1.0, size=hq)
    return slopes.astype(np.float32).astype(np.float64)


@st.composite
def convention_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, regimes: tuple[str, ...] = REGIMES,
                     lengths_: bool = True, softcap: bool = True, alibi: bool = True, window: bool = True,
                     causal: bool = True, empty_rows: bool = True, grad: bool = False, min_b: int = 1,
                     lq_pool: tuple[int, ...] | None = None, lk_pool: tuple[int, ...] | None = None) -> Case:
    """A case made of what flash-attention-style kernels take: GQA, Lq != Lk, bottom-right causal
    (top-left where Lq == Lk), a sliding window (left, right), softcap, ALiBi, lengths, a custom scale.
    `lq_pool` / `lk_pool` fix the lengths to draw from (default: `lengths(max_len)`)."""
    s = draw(palette_shapes(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                      require=lambda t: t["B"] >= min_b and t["Lq"] in (lq_pool or (t["Lq"],))
                      and t["Lk"] in (lk_pool or (t["Lk"],)))) if limit("palette") else None
    if s is not None:
        b, lq, lk = s["B"], *fit_lengths(draw, s["Lq"], s["Lk"])
        s = {**s, "Lq": lq, "Lk": lk}
    else:
        lq = draw(st.sampled_from(lq_pool)) if lq_pool else draw(lengths(max_len))
        if lk_pool:
            lk = draw(st.sampled_from(lk_pool))
        else:
            lk = draw(lengths(max_len)) if draw(st.booleans()) else lq
        lq, lk = fit_lengths(draw, lq, lk)
        hkv = draw(st.sampled_from((1, 2, 3)))
        group = draw(st.sampled_from((1, 2, 3, 4)))
        dk = draw(st.sampled_from(CONV_HEAD_DIMS))
        b = draw(st.sampled_from(tuple(n for n in (1, 2, 3) if n >= min_b)))
        while b * hkv * group * lq * lk * 2 * dk > BUDGET and (b > min_b or hkv > 1):
            if b > min_b:
                b -= 1
            else:
                hkv -= 1
        s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dk}
    dtype = draw(dtype_choice(dtypes))
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    p: dict = {}
    if causal and draw(st.integers(0, 2)) == 0:
        p["causal"] = draw(st.sampled_from(("bottom_right", "bottom_right", "top_left"))) if lq == lk else "bottom_right"
    if window and draw(st.integers(0, 2)) == 0:
        left, right = draw(st.sampled_from(WINDOW_BOUNDS)), draw(st.sampled_from(WINDOW_BOUNDS))
        if left == right == -1:
            left = 0
        p["window"] = (left, right)
        p["window_align"] = draw(st.sampled_from(("bottom_right", "top_left"))) if lq == lk else "bottom_right"
    if softcap and draw(st.integers(0, 3)) == 0:
        p["softcap"] = draw(st.sampled_from(SOFTCAPS))
    if alibi and draw(st.integers(0, 3)) == 0:
        p["alibi_slopes"] = convention_alibi_slopes(rng, b, s["Hq"], draw(st.sampled_from(("geometric", "uniform", "batch",
                                                                                        "steep", "negative", "mixed_sign"))))
    if lengths_ and draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(0 if empty_rows else 1, lk + 1, size=b)
        if draw(st.booleans()):
            p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
    if draw(st.integers(0, 4)) == 0:
        p["scale"] = draw(st.sampled_from(CUSTOM_SCALES))
    layout = draw(st.sampled_from(("contiguous", "contiguous", "noncontiguous")))
    if grad:
        p["grad_out"] = rng.normal(size=(b, s["Hq"], lq, s["Dv"]))
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **p)


@st.composite
def varlen_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, empty: bool = False) -> Case:
    """A packed batch of 2..4 sequences of different lengths (`empty`: at least one has no queries or
    no keys), maybe with causal, window, softcap, ALiBi; the pack order is drawn into packing["seq_order"]."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, lengths_=False, min_b=2,
                                 regimes=("ordinary", "ordinary", "large", "mixed")))
    s = case.shape
    b = s["B"]
    rng = np.random.default_rng(case.seed + 3)
    kl = rng.integers(1, s["Lk"] + 1, size=b)
    ql = rng.integers(1, s["Lq"] + 1, size=b)
    if empty:
        which = int(rng.integers(b))
        if draw(st.booleans()):
            kl[which] = 0
        else:
            ql[which] = 0
    order = [int(i) for i in rng.permutation(b)]
    return case.replace(q_lengths=ql, kv_lengths=kl, packing={"seq_order": order}, grad_out=None)


def perturb_sequence(case: Case, b: int, rng: np.random.Generator) -> Case:
    """The case with every query, key and value of sequence b (padding included) redrawn, three times larger."""
    q, k, v = case.q.copy(), case.k.copy(), case.v.copy()
    q[b], k[b], v[b] = (3.0 * rng.normal(size=x[b].shape) for x in (q, k, v))
    if case.dtype == "float16":
        q = np.clip(q, -3e4, 3e4)
    return case.replace(q=q, k=k, v=v)


PAGED_LQ = (1, 1, 2, 3, 5, 8)
PAGED_LK = (1, 5, 17, 64, 255, 256, 257, 300, 385, 513)


@st.composite
def paged_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, append: bool | None = None) -> Case:
    """A KV-cache case (decode-like: a few queries, up to 513 keys so that sequences cross page
    boundaries; no query padding) with an explicit paged layout: packing page_size (256 or 512, as the
    convention requires), block_seed, spare_blocks and new_keys (appended in the call; `append` forces
    some or none)."""
    case = draw(convention_cases(dtypes=dtypes, lengths_=False, regimes=("ordinary", "large"), lq_pool=PAGED_LQ,
                                 lk_pool=PAGED_LK))
    s = case.shape
    rng = np.random.default_rng(case.seed + 5)
    kl = rng.integers(1, s["Lk"] + 1, size=s["B"]) if draw(st.booleans()) else None
    shortest = int(kl.min()) if kl is not None else s["Lk"]
    if append is None:
        append = draw(st.booleans())
    new = int(draw(st.integers(1, max(1, min(shortest, 4))))) if append else 0
    packing = {"page_size": draw(st.sampled_from((256, 256, 512))), "block_seed": draw(st.integers(0, 2**31 - 1)),
               "spare_blocks": draw(st.integers(0, 3)), "new_keys": min(new, shortest)}
    return case.replace(kv_lengths=kl, q_lengths=None, packing=packing, grad_out=None)


@st.composite
def lse_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = LSE_DTYPES,
              masks: bool = True) -> Case:
    """Cases whose lse the tolerance model judges soundly today: causal, windows, lengths, GQA, custom
    scale, plus (`masks`) boolean masks, and no softcap or ALiBi (the emulated baseline does not
    model them yet, so their lse allowance would be loose)."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, softcap=False, alibi=False))
    if masks and draw(st.integers(0, 3)) == 0:
        s = case.shape
        rng = np.random.default_rng(case.seed + 7)
        case = case.replace(mask=rng.random((s["B"], 1, s["Lq"], s["Lk"])) < 0.7)
    return case


@st.composite
def lse_merge_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = LSE_DTYPES) -> Case:
    """No causal, window or ALiBi (splitting the keys would move their alignment), Lk >= 2, no empty
    rows: the keys can be split into chunks whose LSE-weighted outputs merge into the whole."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, causal=False, window=False, alibi=False,
                                 softcap=False, empty_rows=False, regimes=("ordinary", "large", "mixed")))
    if case.shape["Lk"] < 2:
        rng = np.random.default_rng(case.seed)
        s = {**case.shape, "Lk": 5}
        _, k, v = values(rng, s, case.regime, case.dtype)
        case = case.replace(k=k, v=v, kv_lengths=None)
    return case


@st.composite
def lse_empty_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = LSE_DTYPES) -> Case:
    """Cases with rows that see no key, made the ways conventions can say: bottom-right causal with
    Lq > Lk, a bottom-right window that ends before the first key, or a sequence with no keys."""
    how = draw(st.sampled_from(("causal", "causal", "window", "no_keys")))
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, softcap=False, alibi=False, causal=False,
                                 window=False, lengths_=False, regimes=("ordinary", "large")))
    s = case.shape
    rng = np.random.default_rng(case.seed + 11)
    if how == "no_keys":
        kl = rng.integers(0, s["Lk"] + 1, size=s["B"])
        kl[int(rng.integers(s["B"]))] = 0
        return case.replace(kv_lengths=kl, causal=draw(st.sampled_from((None, "bottom_right"))))
    lq = max(s["Lq"], 2)
    lk = draw(st.integers(1, lq - 1))
    q = values(rng, {**s, "Lq": lq}, case.regime, case.dtype)[0]
    params = {"causal": "bottom_right"} if how == "causal" else {"window": (draw(st.sampled_from((0, 1, 2))), 0)}
    return case.replace(q=q, k=case.k[:, :, :lk], v=case.v[:, :, :lk], **params)
