"""Cases that certainly hide keys or rows: boolean masks, -inf bias, lengths, fully-masked rows, masks
that differ between batch elements."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import declared_choice, dtype_choice
from attnconf.conformance.strategies.plain import cases, mask_params
from attnconf.conformance.strategies.sizes import BUDGET, palette_family, shapes
from attnconf.conformance.strategies.values import values
from attnconf.reference import DTYPES, Case


def _hide_rows_kept(rng: np.random.Generator, m: np.ndarray) -> np.ndarray:
    """Give every all-False row of a bool mask one True entry (so the mask empties no row)."""
    m = m.copy()
    empty = ~m.any(axis=-1)
    for idx in zip(*np.nonzero(empty)):
        m[idx + (int(rng.integers(m.shape[-1])),)] = True
    return m


@st.composite
def mask_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """A case that certainly has a boolean mask (drawn shape and density), maybe with bias, causal, padding."""
    empty_rows = draw(st.booleans())
    case = draw(cases(max_len=max_len, dtypes=dtypes, empty_rows=empty_rows, layouts=False))
    if case.mask is not None:
        return case
    s = case.shape
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    rng = np.random.default_rng(case.seed + 1)
    mshape = draw(st.sampled_from(((b, 1, lq, lk), (lq, lk), (b, hq, lq, lk), (b, 1, 1, lk))))
    m = rng.random(mshape) < draw(st.sampled_from((0.5, 0.8, 0.2)))
    return case.replace(mask=m if empty_rows else _hide_rows_kept(rng, m))


HIDING = {"mask": "mask", "bias": "bias", "kv_lengths": "kv_lengths"}     # ways to hide a key -> feature


@st.composite
def hidden_key_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """A case in which every batch element has key positions that no query sees, hidden by a
    bool-mask column, a -inf bias column or kv_lengths (on top of what `cases` drew)."""
    empty_rows = draw(st.booleans())
    case = draw(cases(max_len=max_len, dtypes=dtypes, empty_rows=empty_rows))
    s = case.shape
    b, lk = s["B"], s["Lk"]
    rng = np.random.default_rng(case.seed + 2)
    how = draw(declared_choice(HIDING))
    if how == "kv_lengths":
        lo = 1 if not empty_rows and lk > 1 else 0
        n = rng.integers(lo, lk, size=b)
        return case.replace(kv_lengths=n if case.kv_lengths is None else np.minimum(n, case.kv_lengths))
    hide = rng.random((b, lk)) < draw(st.sampled_from((0.25, 0.5)))
    hide[np.arange(b), rng.integers(lk, size=b)] = True
    if not empty_rows and lk > 1:
        keep = rng.integers(lk, size=b)
        hide[np.arange(b), keep] = False
    cols = ~hide[:, None, None, :]
    if how == "mask":
        return case.replace(mask=cols if case.mask is None else np.logical_and(case.mask, cols))
    bias = np.zeros((1, 1, 1, lk)) if case.bias is None else case.bias
    return case.replace(bias=np.where(cols, bias, -np.inf))


EMPTY_SOURCES = {"mask_row": "mask", "bias_row": "bias", "q_lengths": "q_lengths", "kv_lengths": "kv_lengths",
                 "bottom_right": "causal_bottom_right"}          # how a row is emptied -> the feature it needs


@st.composite
def empty_row_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = DTYPES,
                    sources: tuple[str, ...] = tuple(EMPTY_SOURCES)) -> Case:
    """A case that certainly has fully-masked query rows, made by a mask row, a -inf bias row,
    query padding, a zero key length, or bottom-right causal with Lq > Lk."""
    how = draw(declared_choice({k: v for k, v in EMPTY_SOURCES.items() if k in sources}))
    s = draw(palette_family(max_len, lambda t: t["Lq"] > t["Lk"])) if how == "bottom_right" else None
    if s is None:
        s = draw(shapes(max_len=max_len))
        if how == "bottom_right":
            s["Lq"] = max(s["Lq"], 2)
            s["Lk"] = draw(st.integers(1, s["Lq"] - 1))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, draw(st.sampled_from(("ordinary", "ordinary", "large"))), dtype)
    p = draw(mask_params(rng, s, causal=how != "bottom_right"))
    b, lq, lk = s["B"], s["Lq"], s["Lk"]
    where = (int(rng.integers(b)), int(rng.integers(lq)))
    if how == "bottom_right":
        p["causal"] = "bottom_right"
        p.pop("q_lengths", None)
        p.pop("kv_lengths", None)
    elif how == "mask_row":
        m = np.ones((b, 1, lq, lk), dtype=bool)
        m[where[0], :, where[1], :] = False
        p["mask"] = m if p.get("mask") is None else np.logical_and(p["mask"], m)
    elif how == "bias_row":
        old = p.get("bias", np.zeros((1, 1, 1, 1)))
        bias = np.broadcast_to(old, np.broadcast_shapes(old.shape, (b, 1, lq, lk))).copy()
        bias[where[0], :, where[1], :] = -np.inf
        p["bias"] = bias
    elif how == "q_lengths":
        ql = p.get("q_lengths", rng.integers(0, lq + 1, size=b)).copy()
        ql[where[0]] = min(ql[where[0]], int(rng.integers(0, lq)))
        p["q_lengths"] = ql
    else:
        kl = p.get("kv_lengths", rng.integers(0, lk + 1, size=b)).copy()
        kl[where[0]] = 0
        p["kv_lengths"] = kl
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime="ordinary", **p)


@st.composite
def per_batch_mask_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """B >= 2 and a mask, -inf bias or lengths that certainly differ between batch elements."""
    s = draw(palette_family(max_len, lambda t: t["B"] >= 2))
    if s is None:
        s = draw(shapes(max_len=max_len))
        s["B"] = draw(st.sampled_from((2, 3)))
        if s["B"] * s["Hq"] * s["Lq"] * s["Lk"] * (s["Dk"] + s["Dv"]) > BUDGET:
            s["Hq"] = s["Hkv"] = 1
            s["Dk"] = s["Dv"] = min(s["Dk"], 16)
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, "ordinary", dtype)
    p = draw(mask_params(rng, s, masks=False, bias=False, padding=False))
    how = draw(declared_choice({**HIDING, "q_lengths": "q_lengths"}))
    if how in ("mask", "bias"):
        shape = draw(st.sampled_from(((b, 1, lq, lk), (b, hq, lq, lk), (b, 1, 1, lk))))
        m = rng.random(shape) < 0.5
        if (m == m[:1]).all():
            m[1].flat[int(rng.integers(m[1].size))] ^= True
        if how == "mask":
            p["mask"] = m
        else:
            p["bias"] = np.where(m, rng.normal(size=shape), -np.inf)
    else:
        n = lk if how == "kv_lengths" else lq
        lens = rng.integers(0, n + 1, size=b)
        if (lens == lens[0]).all():
            lens[1] = (lens[0] + 1) % (n + 1)
        p[how] = lens
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)
