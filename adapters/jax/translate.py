"""How a `reference.Case` becomes a `jax.nn.dot_product_attention` call.

The JAX convention is BTNH (batch, length, heads, head dim), a boolean `mask`
(True = attend) and an additive `bias` that may be given together, `is_causal`
(top-left: `tril` of the (T, S) logits) and per-batch `query_seq_lengths` /
`key_value_seq_lengths`. Everything the convention says directly is passed
directly; only bottom-right causal alignment that differs from top-left is
folded into the boolean mask, per batch element with the case's lengths.
GQA is expressed by giving K and V fewer heads: JAX reshapes the query heads
to (K, G), so query head n uses KV head n // G (repeat_interleave grouping).

Sliding windows: `local_window_size=(left, right)` keeps key j for query i iff
`i - left <= j <= i + right` (`_get_window_mask` in jax/_src/nn/functions.py:
`query_pos <= key_pos + left_window` and `query_pos >= key_pos - right_window`,
built from the padded extents T, S alone), an int meaning `(w, w)`. That is the
spec's window aligned top-left (ATTN-WIN-2, offset 0), and'ed with `is_causal`,
the mask and the padding masks. A window is passed as `local_window_size` where
the case's alignment offset is 0 in every batch element that has queries
(top-left always; bottom-right when kv_len == q_len); a bound of -1 (unbounded)
becomes the bound that never binds (left Lq - 1, right Lk - 1), since JAX gives
-1 no special meaning (`i <= j - 1` would drop the diagonal). Any other window is
folded into the boolean mask, per batch element, like bottom-right causal.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnconf.reference import Case, causal_visible
from attnconf.reference.attention import window_visible


@dataclass
class JaxCall:
    """The arguments of one `jax.nn.dot_product_attention` call, as NumPy arrays."""

    q: np.ndarray                      # (B, Lq, Hq, Dk), float64 values
    k: np.ndarray                      # (B, Lk, Hkv, Dk)
    v: np.ndarray                      # (B, Lk, Hkv, Dv)
    bias: np.ndarray | None = None     # 4-D, broadcastable to (B, Hq, Lq, Lk)
    mask: np.ndarray | None = None     # 4-D bool, broadcastable to (B, Hq, Lq, Lk)
    is_causal: bool = False
    scale: float | None = None
    q_lengths: np.ndarray | None = None   # int32 (B,)
    kv_lengths: np.ndarray | None = None  # int32 (B,)
    local_window_size: tuple[int, int] | None = None   # (left, right), top-left, both >= 0
    notes: list[str] = field(default_factory=list)


def to_btnh(x: np.ndarray) -> np.ndarray:
    """(B, H, L, D) -> (B, L, H, D)."""
    return np.ascontiguousarray(np.swapaxes(x, 1, 2))


def from_btnh(x: np.ndarray) -> np.ndarray:
    """(B, L, H, D) -> (B, H, L, D)."""
    return np.swapaxes(np.asarray(x), 1, 2)


def as_4d(x: np.ndarray | None) -> np.ndarray | None:
    if x is None:
        return None
    x = np.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _offset_zero(case: Case, *, except_empty: bool = False) -> bool:
    """Bottom-right alignment equals top-left: kv_len == q_len in every batch element (`except_empty`: in
    every one that has queries; a window may ignore the others, whose rows are all padding)."""
    s = case.shape
    ql = np.full(s["B"], s["Lq"]) if case.q_lengths is None else np.asarray(case.q_lengths)
    kl = np.full(s["B"], s["Lk"]) if case.kv_lengths is None else np.asarray(case.kv_lengths)
    return bool(np.all((ql == kl) | (except_empty & (ql == 0))))


def _per_batch(case: Case, visible) -> np.ndarray:
    """(B, 1, Lq, Lk) bool: `visible(lq, lk, q_len, kv_len)` with each batch element's lengths."""
    s = case.shape
    out = np.empty((s["B"], 1, s["Lq"], s["Lk"]), dtype=bool)
    for b in range(s["B"]):
        ql = None if case.q_lengths is None else int(case.q_lengths[b])
        kl = None if case.kv_lengths is None else int(case.kv_lengths[b])
        out[b, 0] = visible(s["Lq"], s["Lk"], ql, kl)
    return out


def bottom_right_mask(case: Case) -> np.ndarray:
    """(B, 1, Lq, Lk) bool: bottom-right causal visibility with each batch element's lengths."""
    return _per_batch(case, lambda lq, lk, ql, kl: causal_visible(lq, lk, "bottom_right", ql, kl))


def window_is_top_left(case: Case) -> bool:
    """The case's window sits on the top-left diagonal in every batch element that has queries:
    `local_window_size` can say it."""
    return case.window is None or case.window_align == "top_left" or _offset_zero(case, except_empty=True)


def local_window_size(case: Case) -> tuple[int, int] | None:
    """`case.window` as `local_window_size` (top-left; -1 -> the bound that never binds); None for (-1, -1)."""
    if case.window is None or tuple(case.window) == (-1, -1):
        return None
    s = case.shape
    left, right = (int(w) for w in case.window)
    return (left if left >= 0 else max(s["Lq"] - 1, 0), right if right >= 0 else max(s["Lk"] - 1, 0))


def window_mask(case: Case) -> np.ndarray:
    """(B, 1, Lq, Lk) bool: the case's window visibility (either alignment) with each batch element's lengths."""
    return _per_batch(case, lambda lq, lk, ql, kl: window_visible(lq, lk, case.window, case.window_align, ql, kl))


def translate(case: Case) -> JaxCall:
    """The JAX-convention arguments that express `case` exactly."""
    call = JaxCall(q=to_btnh(case.q), k=to_btnh(case.k), v=to_btnh(case.v), scale=case.scale)
    mask = as_4d(case.mask)
    if case.causal == "top_left":
        call.is_causal = True
    elif case.causal == "bottom_right":
        if _offset_zero(case):
            call.is_causal = True
            call.notes.append("bottom_right == top_left here: is_causal=True")
        else:
            br = bottom_right_mask(case)
            mask = br if mask is None else (mask & br)
            call.notes.append("bottom_right folded into mask")
    if case.window is not None:
        if window_is_top_left(case):
            call.local_window_size = local_window_size(case)
            if call.local_window_size is None:
                call.notes.append("window (-1, -1) is no window")
            elif tuple(call.local_window_size) != tuple(case.window):
                call.notes.append(f"window {list(case.window)}: -1 passed as a bound that never binds, "
                                  f"local_window_size={call.local_window_size}")
        else:
            wm = window_mask(case)
            mask = wm if mask is None else (mask & wm)
            call.notes.append(f"window {list(case.window)}@{case.window_align} folded into mask")
    call.mask = mask
    call.bias = as_4d(case.bias)
    if case.q_lengths is not None:
        call.q_lengths = case.q_lengths.astype(np.int32)
    if case.kv_lengths is not None:
        call.kv_lengths = case.kv_lengths.astype(np.int32)
    return call
