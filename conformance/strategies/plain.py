"""Cases anywhere in the spec's domain (`cases`) and the general families built on it: fixed lengths or
heads (`cases_with_shape`, `gqa_cases`), causal masking, weights readable through one-hot V, identical keys.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import allows, dtype_choice, limit
from attnconf.conformance.strategies.sizes import (BUDGET, GROUPS, MEDIUM_LENGTHS, SMALL_LENGTHS, fit_lengths,
                                                   lengths, palette_shapes, shapes)
from attnconf.conformance.strategies.values import REGIMES, sink_values, values
from attnconf.reference import DTYPES, Case
from attnconf.spec.vocabulary import ALIGNMENTS


@st.composite
def mask_params(draw, rng: np.random.Generator, s: dict[str, int], *, causal: bool = True, masks: bool = True,
                padding: bool = True, bias: bool = True, empty_rows: bool = True) -> dict:
    """Case.build keywords for shape `s`: causal, a mask, a bias, lengths, each as the switches and the
    declared features allow (`empty_rows`: they may leave a query row without a key)."""
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    p: dict = {}
    alignments = tuple(a for a in ALIGNMENTS if allows("causal_" + a))
    if lq != lk and not allows("cross"):
        alignments = ()
    if causal and alignments:
        p["causal"] = draw(st.sampled_from((None, None) + alignments))
    masks, bias = masks and allows("mask"), bias and allows("bias")
    if p.get("causal") and not allows("mask_with_causal"):
        masks = bias = False
    if masks and draw(st.integers(0, 2)) == 0:
        density = draw(st.sampled_from((0.5, 0.9, 0.1)))
        mshape = draw(st.sampled_from(((b, 1, lq, lk), (1, 1, lq, lk), (b, hq, lq, lk), (lq, lk), (b, 1, 1, lk),
                                       (lk,))))
        m = rng.random(mshape) < density
        if empty_rows and len(mshape) >= 2 and mshape[-2] == lq and draw(st.integers(0, 3)) == 0:
            m[..., int(rng.integers(lq)), :] = False     # a fully-masked row
        p["mask"] = m
    if bias and draw(st.integers(0, 3)) == 0:
        bshape = draw(st.sampled_from(((b, hq, lq, lk), (1, hq, lq, lk), (b, 1, lq, lk), (lq, lk))))
        bias_ = rng.normal(size=bshape) * draw(st.sampled_from((1.0, 3.0)))
        if draw(st.booleans()):
            bias_[rng.random(bshape) < 0.2] = -np.inf
        p["bias"] = bias_
    if padding and allows("kv_lengths") and draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(0 if empty_rows else 1, lk + 1, size=b)
        if allows("q_lengths") and draw(st.booleans()):
            p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
        if limit("kv_covers_q"):
            p["kv_lengths"] = np.minimum(np.maximum(p["kv_lengths"], p.get("q_lengths", np.full(b, lq))), lk)
    elif padding and allows("q_lengths") and draw(st.integers(0, 5)) == 0:
        # query padding alone: keys past a sequence's query length stay visible (a kernel that masks them
        # with q_lengths where no kv_lengths were given is wrong)
        p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
    return p


@st.composite
def cases(draw, *, dtypes: tuple[str, ...] = DTYPES, regimes: tuple[str, ...] = REGIMES, causal: bool = True,
          masks: bool = True, padding: bool = True, bias: bool = True, empty_rows: bool = True, gqa: bool = True,
          cross: bool = True, dv_ne_dk: bool = True, same_d: bool = False, custom_scale: bool = True,
          layouts: bool = True, grad: bool = False, max_len: int = 385, sinks: bool = False) -> Case:
    """A validated Case anywhere in the spec's domain (restrict with the keyword switches). `sinks`: one case
    in four gets per-head sinks where the implementation declares them (the properties hold with sinks)."""
    s = draw(shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk, max_len=max_len, same_d=same_d))
    dtype = draw(dtype_choice(dtypes))
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    params = draw(mask_params(rng, s, causal=causal, masks=masks, padding=padding, bias=bias, empty_rows=empty_rows))
    if custom_scale and allows("custom_scale") and draw(st.integers(0, 4)) == 0:
        params["scale"] = draw(st.sampled_from((0.5, 1.0, 0.125, 2.0, 0.01, 0.0)))   # 0: every visible key alike
    layout = "contiguous"
    if layouts:
        layout = draw(st.sampled_from(("contiguous", "contiguous", "contiguous")
                                      + tuple(x for x in ("noncontiguous", "broadcast_kv") if allows(x))))
        if layout == "broadcast_kv":
            k = np.broadcast_to(k[:1], k.shape).copy()
            v = np.broadcast_to(v[:1], v.shape).copy()
    if grad:
        params["grad_out"] = rng.normal(size=(s["B"], s["Hq"], s["Lq"], s["Dv"]))
    case = Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **params)
    if sinks and allows("sinks") and draw(st.integers(0, 3)) == 0:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


def visible_rows_only(case: Case) -> bool:
    """Every query row sees at least one key."""
    from attnconf.reference import oracle

    return bool(oracle(case).visible.any(axis=-1).all())


@st.composite
def onehot_cases(draw, *, max_len: int = 33, max_chunks: int = 4, sinks: bool = False) -> Case:
    """Small cases with Dv = Dk whose weights can be read through one-hot V in at most `max_chunks` calls.

    Dk is raised to ceil(Lk / max_chunks) where needed (q and k redrawn from the case's seed).
    """
    case = draw(cases(max_len=max_len, same_d=True, dv_ne_dk=False, sinks=sinks))
    s = case.shape
    d = max(s["Dk"], -(-s["Lk"] // max_chunks))
    if d == s["Dk"]:
        return case
    rng = np.random.default_rng(case.seed)
    q, k, v = values(rng, {**s, "Dk": d, "Dv": d}, case.regime, case.dtype)
    if case.layout == "broadcast_kv":
        k, v = np.broadcast_to(k[:1], k.shape).copy(), np.broadcast_to(v[:1], v.shape).copy()
    return case.replace(q=q, k=k, v=v, grad_out=None)


@st.composite
def causal_cases(draw, *, max_len: int = 65, alignment: str | None = None, tall: bool = False) -> Case:
    """Cases with causal masking on (both alignments unless `alignment`); `tall`: bottom_right with Lq > Lk."""
    if tall:
        s = draw(palette_shapes(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                          require=lambda s: s["Lq"] > s["Lk"])) if limit("palette") else None
        if s is not None:
            return draw(cases_with_palette_shape(s)).replace(causal="bottom_right")
        lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if n < max_len]))
        lq = draw(st.sampled_from([n for n in SMALL_LENGTHS + MEDIUM_LENGTHS if lk < n <= max_len]))
        case = draw(cases_with_shape(lq=lq, lk=lk))
        return case.replace(causal="bottom_right")
    case = draw(cases(max_len=max_len))
    return case.replace(causal=alignment or draw(st.sampled_from(("top_left", "bottom_right"))))


@st.composite
def cases_with_shape(draw, *, lq: int, lk: int, hkv: int | None = None, group: int | None = None,
                     dk: int | None = None, b: int | None = None, **switches) -> Case:
    """Like `cases`, with the given lengths (and head counts / head dim / batch where given) fixed."""
    b = b if b is not None else draw(st.sampled_from((1, 2, 3)))
    hkv = hkv if hkv is not None else draw(st.sampled_from((1, 2, 3)))
    group = group if group is not None else draw(st.sampled_from(GROUPS))
    dk = dk if dk is not None else draw(st.sampled_from((8, 16, 4, 1, 32, 64)))
    while b * hkv * group * lq * lk * 2 * dk > BUDGET and b > 1:
        b -= 1
    s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dk}
    dtype = draw(dtype_choice(switches.pop("dtypes", DTYPES)))
    regime = draw(st.sampled_from(switches.pop("regimes", REGIMES)))
    layouts = switches.pop("layouts", True)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    params = draw(mask_params(rng, s, **switches))
    layout = draw(st.sampled_from(("contiguous", "contiguous")
                                  + tuple(x for x in ("noncontiguous", "broadcast_kv") if allows(x)))) if layouts \
        else "contiguous"
    if layout == "broadcast_kv":
        k, v = np.broadcast_to(k[:1], k.shape).copy(), np.broadcast_to(v[:1], v.shape).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **params)


@st.composite
def gqa_cases(draw, *, max_len: int = 65, mqa: bool = False, **switches) -> Case:
    """Hkv < Hq with distinct KV heads: 2..4 KV heads in groups of 2..4, or Hkv = 1 (MQA) when `mqa`."""
    if limit("palette"):
        s = draw(palette_shapes(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                          require=lambda s: s["Hq"] > s["Hkv"] and (s["Hkv"] == 1) == mqa))
        if s is not None:
            return draw(cases_with_palette_shape(s, fit=True, **switches))
    lq = draw(lengths(max_len))
    lk = draw(lengths(max_len)) if draw(st.booleans()) else lq
    lq, lk = fit_lengths(draw, lq, lk)
    hkv = 1 if mqa else draw(st.sampled_from((2, 3, 4, 8)))
    group = draw(st.sampled_from((2, 4, 8) if mqa else (2, 3, 4)))
    return draw(cases_with_shape(lq=lq, lk=lk, hkv=hkv, group=group, **switches))


@st.composite
def cases_with_palette_shape(draw, s: dict[str, int], *, fit: bool = False, **switches) -> Case:
    """`cases_with_shape` on a palette shape (Dv = Dk); `fit`: lengths fitted to the declared limits."""
    lq, lk = fit_lengths(draw, s["Lq"], s["Lk"]) if fit else (s["Lq"], s["Lk"])
    return draw(cases_with_shape(lq=lq, lk=lk, hkv=s["Hkv"], group=s["Hq"] // s["Hkv"], dk=s["Dk"], b=s["B"],
                                 **switches))


def without_q_lengths(case: Case) -> Case:
    """The case with query padding removed (key padding kept)."""
    return case if case.q_lengths is None else case.replace(q_lengths=None)


@st.composite
def identical_key_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, sinks: bool = False) -> Case:
    """Every key of a (batch, KV head) is the same vector; bool masks, causal and padding allowed, no bias;
    `sinks` as in `cases`."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, bias=False, sinks=sinks))
    return case.replace(k=np.broadcast_to(case.k[:, :, :1], case.k.shape).copy())
