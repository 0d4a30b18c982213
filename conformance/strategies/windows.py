"""Sliding windows (ATTN-WIN-*) and chunked local attention (ATTN-CHUNK-*).

Each strategy takes `dtypes=` and draws the dtype with `dtype_choice(dtypes)` (through `cases`, or
directly): the cell's dtype, inside the declared scope.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import dtype_choice
from attnconf.conformance.strategies.plain import cases, cases_with_shape, visible_rows_only
from attnconf.conformance.strategies.sizes import LARGE_LENGTHS, SMALL_LENGTHS
from attnconf.conformance.strategies.values import sink_values
from attnconf.reference import DTYPES, Case
from attnconf.spec.vocabulary import ALIGNMENTS as _SPEC_ALIGNMENTS


# bottom-right first: draws shrink toward it
ALIGNMENTS = _SPEC_ALIGNMENTS[::-1]


def window_side(draw, lk: int) -> int:
    """-1 (unbounded), a bound of 0..3 keys, or a bound of a quarter or half of Lk: values that matter."""
    return draw(st.sampled_from((-1, 0, 1, 2, 3, max(lk // 4, 1), max(lk // 2, 1))))


@st.composite
def window_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, causal: bool = True,
                 empty_rows: bool = True, grad: bool = False, layouts: bool = False, **switches) -> Case:
    """A case with a sliding window (ATTN-WIN-*): either alignment, each side -1 or a bound that matters
    (0..3 keys, Lk/4, Lk/2), at least one side bounded; combined with causal masking of either alignment,
    masks and padding as `cases` draws them. Lq != Lk half the time, so alignment matters, and bottom-right
    windows over Lq > Lk or top-left windows past Lk leave rows empty (not with empty_rows=False, which
    also keeps masks and padding from emptying rows and widens a window that would)."""
    if draw(st.integers(0, 7)) == 0:    # now and then lengths past 128-key blocks, where local kernels skip blocks
        max_len = max(max_len, max(LARGE_LENGTHS))
    case = draw(cases(max_len=max_len, dtypes=dtypes, causal=causal, empty_rows=empty_rows, grad=grad,
                      layouts=layouts, **switches))
    lk = case.shape["Lk"]
    left, right = window_side(draw, lk), window_side(draw, lk)
    if left == right == -1:
        left = draw(st.sampled_from((0, 1, 2)))
    out = case.replace(window=(left, right), window_align=draw(st.sampled_from(ALIGNMENTS)))
    if not empty_rows and not visible_rows_only(out):
        out = out.replace(window=(left, -1), window_align="bottom_right", causal=None)
        if not visible_rows_only(out):
            out = out.replace(window=(-1, max(right, 0)), window_align="bottom_right")
    return out


@st.composite
def window_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33) -> Case:
    """Q = 0 and V = the identity (Dk = Dv = Lk): every visible key of a row has weight 1/|J| and the output
    row *is* the weight row, so the keys at and just past each inclusive bound of ATTN-WIN-1 can be read
    off one by one. Either alignment, Lq != Lk half the time, GQA, sometimes causal and padding."""
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if 2 <= n <= max_len]))
    lq = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= max_len])) if draw(st.booleans()) else lk
    hkv, group, b = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = np.zeros((b, hkv * group, lq, lk))
    k = rng.normal(size=(b, hkv, lk, lk))
    v = np.broadcast_to(np.eye(lk), (b, hkv, lk, lk)).copy()
    p: dict = {"window": (window_side(draw, lk), window_side(draw, lk)),
               "window_align": draw(st.sampled_from(ALIGNMENTS)),
               "causal": draw(st.sampled_from((None, None, "top_left", "bottom_right")))}
    if p["window"] == (-1, -1):
        p["window"] = (1, 1)
    if draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
        p["q_lengths"] = rng.integers(1, lq + 1, size=b)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


@st.composite
def window_empty_row_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33, sinks: bool = False) -> Case:
    """A window that certainly leaves rows without a key: bottom-right with Lq > Lk + right (the top rows
    end before key 0), or top-left with Lq > Lk + left (the bottom rows start past the last key); no
    padding or masks, so the window alone empties them. With `sinks`, per-head sinks as well."""
    align = draw(st.sampled_from(ALIGNMENTS))
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= min(16, max_len)]))
    near = draw(st.integers(0, 3))
    lq = min(lk + near + draw(st.integers(1, 9)), max(max_len, lk + near + 1))
    far = draw(st.sampled_from((-1, 0, 1, 2, 5)))
    window = (far, near) if align == "bottom_right" else (near, far)
    case = draw(cases_with_shape(lq=lq, lk=lk, dtypes=dtypes, masks=False, padding=False, bias=False, layouts=False,
                                 causal=False))
    case = case.replace(window=window, window_align=align)
    if sinks:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


@st.composite
def chunk_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, **switches) -> Case:
    """A case with chunked local attention (ATTN-CHUNK-*): chunks of 1, 2, 3 keys, a third or half of Lk, or
    more than Lk (one chunk: plain attention), either alignment, causal half the time as `cases` draws it;
    Lq != Lk half the time, so the aligned position of a query matters."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, **switches))
    lk = case.shape["Lk"]
    size = draw(st.sampled_from(sorted({1, 2, 3, max(1, lk // 3), max(1, lk // 2), lk + 1})))
    return case.replace(chunk=size, window_align=draw(st.sampled_from(ALIGNMENTS)))
