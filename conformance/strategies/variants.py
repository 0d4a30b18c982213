"""Softcap (ATTN-CAP-*), ALiBi (ATTN-ALIBI-*), sinks (ATTN-SINK-*), their mixtures, and decode
(ATTN-DECODE-1) with them.

Each strategy takes `dtypes=` and draws the dtype with `dtype_choice(dtypes)` (through `cases`, or
directly): the cell's dtype, inside the declared scope.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import allows, dtype_choice, limit, offer
from attnconf.conformance.strategies.plain import cases
from attnconf.conformance.strategies.sizes import BUDGET, SMALL_LENGTHS, palette_shapes
from attnconf.conformance.strategies.values import alibi_slopes, sink_values, values
from attnconf.conformance.strategies.windows import ALIGNMENTS, window_side
from attnconf.reference import DTYPES, Case


def scaled_logit_max(case: Case) -> float:
    """max |s <q, k>| over the case (float64), the magnitude a softcap is drawn against."""
    from attnconf.reference import expand_kv

    k = expand_kv(case.k, case.shape["Hq"])
    if k.shape[2] == 0:
        return 0.0
    return float(np.abs(case.effective_scale * np.einsum("bhid,bhjd->bhij", case.q, k)).max(initial=0.0))


@st.composite
def softcap_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                  windows: bool = True, alibi: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with a softcap comparable to its logits (ATTN-CAP-*): c = factor * max|s q.k| with factor
    in (0.05, 0.3, 1, 3), so the cap bends the largest logits hard, some, or barely; the value regimes of
    `cases` (ordinary to 1e4) all occur. Sometimes with a window or ALiBi as well."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    top = scaled_logit_max(case)
    factor = draw(st.sampled_from((0.05, 0.3, 1.0, 3.0)))
    cap = float(f"{max(factor * top, 0.05):.3g}")
    changes: dict = {"softcap": cap}
    if windows and draw(st.integers(0, 3)) == 0:
        lk = case.shape["Lk"]
        changes["window"] = (max(window_side(draw, lk), 0), window_side(draw, lk))
        changes["window_align"] = draw(st.sampled_from(ALIGNMENTS))
    if alibi and draw(st.integers(0, 3)) == 0:
        changes["alibi_slopes"] = draw(alibi_slopes(case))
    return case.replace(**changes)


@st.composite
def alibi_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                windows: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with ALiBi slopes (ATTN-ALIBI-*), per head (Hq,) or per batch and head (B, Hq), either
    alignment, with or without causal masking, padding (per-sequence offsets) and sometimes a window."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    changes: dict = {"alibi_slopes": draw(alibi_slopes(case)), "window_align": draw(st.sampled_from(ALIGNMENTS))}
    if windows and draw(st.integers(0, 3)) == 0:
        lk = case.shape["Lk"]
        changes["window"] = (window_side(draw, lk), max(window_side(draw, lk), 0))
    return case.replace(**changes)


@st.composite
def sink_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
               windows: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with per-head sinks (ATTN-SINK-*), small and dominant (see `sink_values`), sometimes with a
    window; masks, padding and causal masking give rows with no key, whose lse must be the sink."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    if windows and draw(st.integers(0, 2)) == 0:
        lk = case.shape["Lk"]
        case = case.replace(window=(window_side(draw, lk), window_side(draw, lk)),
                            window_align=draw(st.sampled_from(ALIGNMENTS)))
    return case.replace(sinks=draw(sink_values(case)))


DECODE_LENGTHS = (1, 2, 17, 127, 128, 129, 255, 256, 257, 511, 1023, 1024, 2049, 4096)


@st.composite
def decode_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, lengths: tuple[int, ...] = DECODE_LENGTHS,
                 variants: bool = True) -> Case:
    """Decode (ATTN-DECODE-1): Lq = 1 against a long KV, GQA groups up to 8, per-sequence kv lengths,
    bottom-right causal (the query on the last key); with a window (w, -1 or 0), softcap, ALiBi and sinks
    each half the time when `variants`."""
    s = draw(palette_shapes(gqa=True, cross=True, dv_ne_dk=False, max_len=max(lengths),
                      require=lambda t: t["Lq"] == 1 and t["Lk"] in lengths)) if limit("palette") else None
    if s is None:
        lk = draw(st.sampled_from(lengths))
        hkv = draw(st.sampled_from((1, 2)))
        group = draw(st.sampled_from((1, 4, 8)))
        d = draw(st.sampled_from((64, 128, 32, 8)))
        b = draw(st.sampled_from((1, 2, 3)))
        while b * hkv * group * lk * 2 * d > BUDGET and (b > 1 or group > 1 or d > 8):
            if b > 1:
                b -= 1
            elif group > 1:
                group //= 2
            else:
                d //= 2
        s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": 1, "Lk": lk, "Dk": d, "Dv": d}
    b, lk = s["B"], s["Lk"]
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, draw(st.sampled_from(("ordinary", "ordinary", "large", "near_ties"))), dtype)
    p: dict = {"causal": draw(st.sampled_from(("bottom_right", None)))}
    if b > 1 and draw(st.booleans()):
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
    case = Case.build(q, k, v, dtype=dtype, seed=seed, **p)
    if variants:
        changes: dict = {}
        if allows("window_bottom_right") and draw(st.booleans()):
            changes["window"] = (draw(st.sampled_from((0, 1, 7, 63, 255, 1000))), draw(st.sampled_from((-1, 0))))
        if allows("softcap") and draw(st.booleans()):
            changes["softcap"] = float(f"{max(0.3 * scaled_logit_max(case), 0.05):.3g}")
        if allows("alibi") and draw(st.booleans()):
            changes["alibi_slopes"] = draw(alibi_slopes(case))
        case = case.replace(**changes) if changes else case
        if allows("sinks"):
            offer("sinks")
            if draw(st.booleans()):
                case = case.replace(sinks=draw(sink_values(case)))
    return case


def variant_alignments(*features: str) -> tuple[str, ...]:
    """The alignments under which the implementation declares every feature of `features` (window,
    alibi): window_<alignment>; ALiBi top-left is its own capability (alibi_top_left)."""
    out = []
    for align in ALIGNMENTS:
        need = [("window_" + align) if f == "window" else ("alibi_top_left" if align == "top_left" else "alibi")
                for f in features]
        if allows(*need):
            out.append(align)
    return tuple(out)


@st.composite
def variant_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                  sinks: bool = True, layouts: bool = False, **switches) -> Case:
    """Any mixture of the variants (window, softcap, ALiBi, sinks), at least one, on top of `cases`."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    lk = case.shape["Lk"]
    offered = tuple(f for f in (("window", "softcap", "alibi", "sinks") if sinks else ("window", "softcap", "alibi"))
                    if {"window": bool(variant_alignments("window")), "alibi": bool(variant_alignments("alibi")),
                        "softcap": allows("softcap"), "sinks": allows("sinks")}[f])
    if not offered:          # the implementation declares none of the variants: a plain case
        return case
    if "sinks" in offered:
        offer("sinks")
    on = draw(st.lists(st.sampled_from(offered), min_size=1, max_size=len(offered), unique=True))
    changes: dict = {}
    if "window" in on:
        changes["window"] = (window_side(draw, lk), window_side(draw, lk))
    if "softcap" in on:
        changes["softcap"] = float(f"{max(draw(st.sampled_from((0.1, 0.5, 2.0))) * scaled_logit_max(case), 0.05):.3g}")
    if "alibi" in on:
        changes["alibi_slopes"] = draw(alibi_slopes(case))
    if changes:
        aligns = variant_alignments(*[f for f in ("window", "alibi") if f in on]) or ALIGNMENTS
        changes["window_align"] = draw(st.sampled_from(aligns))
        case = case.replace(**changes)
    if "sinks" in on:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


@st.composite
def softcap_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """Logits up to ~1e3 against a small cap c in (0.25, 0.5, 1), V = the identity (Dk = Dv = Lk, at least
    4 keys): ATTN-CAP-2 bounds every visible weight by exp(-2c)/n .. exp(2c)/n whatever the logits are."""
    lk = draw(st.sampled_from((4, 5, 8, 11, 16, 17, 32)))
    lq = draw(st.sampled_from((1, 3, 8, 16)))
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mag = draw(st.sampled_from((30.0, 300.0, 1000.0)))
    q = rng.normal(size=(b, hq, lq, lk)) * np.sqrt(mag)
    k = rng.normal(size=(b, hq, lk, lk)) * np.sqrt(mag)
    v = np.broadcast_to(np.eye(lk), (b, hq, lk, lk)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, softcap=draw(st.sampled_from((0.25, 0.5, 1.0))),
                      causal=draw(st.sampled_from((None, "bottom_right"))))


@st.composite
def alibi_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33) -> Case:
    """Q = 0 and V = the identity: row i's weights are exp(-m |i + off - j|) normalised, so the output shows
    the ALiBi bias itself (sign, absolute value, offset, alignment, per-batch slopes). Slopes in [0.05, 1]
    keep the weights of a few keys on each side of the diagonal readable in every dtype; either sign (a
    negative slope moves the weight to the farthest keys, which shows the sign and the distance as well)."""
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if 3 <= n <= max_len]))
    lq = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= max_len])) if draw(st.booleans()) else lk
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = draw(st.sampled_from(((hq,), (b, hq))))
    q = np.zeros((b, hq, lq, lk))
    k = rng.normal(size=(b, 1, lk, lk))
    v = np.broadcast_to(np.eye(lk), (b, 1, lk, lk)).copy()
    p: dict = {"alibi_slopes": rng.uniform(0.05, 1.0, shape) * rng.choice((-1.0, 1.0), shape), "window_align": draw(st.sampled_from(ALIGNMENTS)),
               "causal": draw(st.sampled_from((None, None, "bottom_right", "top_left")))}
    if draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
        p["q_lengths"] = rng.integers(1, lq + 1, size=b)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


def alibi_as_bias(case: Case) -> Case:
    """The case with its ALiBi slopes replaced by the explicit bias of ATTN-ALIBI-1 (added to any bias)."""
    from attnconf.reference.attention import alibi_bias

    s = case.shape
    ali = alibi_bias((s["B"], s["Hq"], s["Lq"], s["Lk"]), case.alibi_slopes, case.window_align,
                     case.q_lengths, case.kv_lengths)
    return case.replace(alibi_slopes=None, bias=ali if case.bias is None else ali + case.bias)
