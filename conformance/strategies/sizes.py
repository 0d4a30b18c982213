"""Shapes: batch, heads, lengths and head dims, drawn where tiled kernels break and inside the cell's limits.

Sizes are bounded so that one example costs milliseconds on a 2-core CPU: the product
B * Hq * Lq * Lk * (Dk + Dv) stays under BUDGET (boundary shapes of boundaries.py excepted). On
an implementation that compiles every new shape, shapes come from the palette (palette.py).
"""
from __future__ import annotations

from hypothesis import strategies as st

from attnconf.conformance.strategies import boundaries, palette
from attnconf.conformance.strategies.cells import allows, current, limit


BUDGET = 1_500_000
# Lengths where tiled kernels break: 1, small primes, 2^k +- 1, = 1 mod 16/32/64/128, several blocks.
SMALL_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 31, 32, 33)
MEDIUM_LENGTHS = (47, 63, 64, 65, 81, 97, 113, 127, 128, 129)
LARGE_LENGTHS = (193, 255, 257, 300, 385)
HEAD_DIMS = (8, 16, 4, 1, 2, 3, 5, 32, 40, 64, 72, 80, 96, 104, 128, 160, 200, 256)
GROUPS = (1, 2, 4, 8)
# short query blocks against a long history (speculative decoding, chunked prefill: split-KV paths)
SHORT_QUERIES, LONG_HISTORIES = (2, 4, 8, 16), (513, 1024)


def head_dims() -> tuple[int, ...]:
    """HEAD_DIMS cut to the cell's declared head dims and cap (the declared ones, or 8, if none is left)."""
    dims, cap = limit("head_dims"), limit("max_head_dim")
    pool = tuple(d for d in HEAD_DIMS if (dims is None or d in dims) and (cap is None or d <= cap))
    return pool or tuple(dims or (8,))


@st.composite
def lengths(draw, max_len: int = 385) -> int:
    """A length up to `max_len` and the cell's max_seqlen, small three times in five, else medium or large."""
    cap = limit("max_seqlen")
    max_len = max_len if cap is None else min(max_len, cap)
    pool = draw(st.sampled_from(("small", "small", "small", "medium", "large")))
    choices = {"small": SMALL_LENGTHS, "medium": MEDIUM_LENGTHS, "large": LARGE_LENGTHS}[pool]
    return draw(st.sampled_from([n for n in choices if n <= max_len] or [1]))


def fit_lengths(draw, lq: int, lk: int) -> tuple[int, int]:
    """(Lq, Lk) moved into the kernel's declared length limits (adapters/contract.py), rounded up to their
    multiples, so that a narrow kernel's cells fill with cases it takes. Limits conditioned on causal or
    gradients, unknown while shapes are drawn, apply as a drawn guess of either (the other half of the
    draws stays free, so the cases those limits do not bind keep every length)."""
    contract = limit("contract")
    if contract is None or not contract.limits:
        return lq, lk
    causal, grads = draw(st.booleans()), draw(st.booleans())
    return contract.fit_lengths(lq, lk, causal=causal, grads=grads, dtype=current().dtype, cap=limit("max_seqlen"),
                                equal=lq == lk and not allows("cross"))


def palette_shapes(require=None, **switches):
    """palette.py's shapes that `switches` (gqa, cross, dv_ne_dk, max_len), `require` and the
    declared scope allow (None if none: the caller draws freely)."""
    return palette.palette_shapes(head_dims=limit("head_dims"), max_seqlen=limit("max_seqlen"),
                                  max_head_dim=limit("max_head_dim"), require=require, **switches)


@st.composite
def palette_family(draw, max_len: int, require) -> dict[str, int] | None:
    """On a compile-per-shape implementation, a palette shape of the family `require` accepts; else None
    (nothing drawn: the caller draws from `shapes()` and bends the shape into the family)."""
    if not limit("palette"):
        return None
    return draw(palette_shapes(gqa=allows("gqa"), cross=allows("cross"), dv_ne_dk=allows("dv_ne_dk"), max_len=max_len,
                         require=require))


@st.composite
def shapes(draw, *, gqa: bool = True, cross: bool = True, dv_ne_dk: bool = True, max_len: int = 385,
           same_d: bool = False) -> dict[str, int]:
    """A shape {B, Hq, Hkv, Lq, Lk, Dk, Dv}: one in eight a kernel branch point (boundaries.py),
    else from the palette or drawn freely inside BUDGET; `gqa`, `cross`, `dv_ne_dk` as declared allow."""
    cross, gqa = cross and allows("cross"), gqa and allows("gqa")
    dv_ne_dk = dv_ne_dk and allows("dv_ne_dk")
    if draw(st.integers(0, 7)) == 0:           # a branch point of real kernels, past the size budget
        s = draw(boundaries.boundary_shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk and not same_d, max_len=max_len,
                                            head_dims=limit("head_dims"), max_seqlen=limit("max_seqlen"),
                                            max_head_dim=limit("max_head_dim")))
        if s is not None:
            if limit("kv_covers_q") and s["Lk"] < s["Lq"]:
                s["Lq"], s["Lk"] = s["Lk"], s["Lq"]
            return s
    if limit("palette"):                      # a compile-per-shape implementation: reuse compiled shapes
        s = draw(palette_shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk and not same_d, max_len=max_len))
        if s is not None:
            if limit("kv_covers_q") and s["Lk"] < s["Lq"]:
                s["Lq"], s["Lk"] = s["Lk"], s["Lq"]
            s["Lq"], s["Lk"] = fit_lengths(draw, s["Lq"], s["Lk"])
            return s
    lq = draw(lengths(max_len))
    lk = draw(lengths(max_len)) if cross and draw(st.booleans()) else lq
    cap = limit("max_seqlen")
    if cross and max_len >= max(LARGE_LENGTHS) and draw(st.integers(0, 9)) == 0:
        longer = [n for n in LONG_HISTORIES if cap is None or n <= cap]
        if longer:
            lq, lk = draw(st.sampled_from(SHORT_QUERIES)), draw(st.sampled_from(longer))
    if limit("kv_covers_q") and lk < lq:      # a kernel whose keys must cover its queries (e.g. a KV-cache op)
        lq, lk = lk, lq
    lq, lk = fit_lengths(draw, lq, lk)
    dk = draw(st.sampled_from(head_dims()))
    dv = draw(st.sampled_from(head_dims())) if dv_ne_dk and not same_d and draw(st.integers(0, 3)) == 0 else dk
    hkv = draw(st.sampled_from((1, 2, 1, 3, 8)))
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
        dk = dv = min(head_dims(), key=lambda d: abs(d - 8))
    return {"B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dv}
