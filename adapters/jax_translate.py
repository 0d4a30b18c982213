"""How a `reference.Case` becomes a `jax.nn.dot_product_attention` call.

The JAX convention is BTNH (batch, length, heads, head dim), a boolean `mask`
(True = attend) and an additive `bias` that may be given together, `is_causal`
(top-left: `tril` of the (T, S) logits) and per-batch `query_seq_lengths` /
`key_value_seq_lengths`. Everything the convention says directly is passed
directly; only bottom-right causal alignment that differs from top-left is
folded into the boolean mask, per batch element with the case's lengths.
GQA is expressed by giving K and V fewer heads: JAX reshapes the query heads
to (K, G), so query head n uses KV head n // G (repeat_interleave grouping).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnconf.reference import Case, causal_visible


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


def _bottom_right_is_top_left(case: Case) -> bool:
    """Bottom-right alignment equals top-left when every batch element has offset 0."""
    s = case.shape
    B = s["B"]
    ql = case.q_lengths if case.q_lengths is not None else np.full(B, s["Lq"])
    kl = case.kv_lengths if case.kv_lengths is not None else np.full(B, s["Lk"])
    return bool(np.all(np.asarray(kl) == np.asarray(ql)))


def bottom_right_mask(case: Case) -> np.ndarray:
    """(B, 1, Lq, Lk) bool: bottom-right causal visibility with each batch element's lengths."""
    s = case.shape
    out = np.empty((s["B"], 1, s["Lq"], s["Lk"]), dtype=bool)
    for b in range(s["B"]):
        ql = None if case.q_lengths is None else int(case.q_lengths[b])
        kl = None if case.kv_lengths is None else int(case.kv_lengths[b])
        out[b, 0] = causal_visible(s["Lq"], s["Lk"], "bottom_right", ql, kl)
    return out


def translate(case: Case) -> JaxCall:
    """The JAX-convention arguments that express `case` exactly."""
    call = JaxCall(q=to_btnh(case.q), k=to_btnh(case.k), v=to_btnh(case.v), scale=case.scale)
    mask = as_4d(case.mask)
    if case.causal == "top_left":
        call.is_causal = True
    elif case.causal == "bottom_right":
        if _bottom_right_is_top_left(case):
            call.is_causal = True
            call.notes.append("bottom_right == top_left here: is_causal=True")
        else:
            br = bottom_right_mask(case)
            mask = br if mask is None else (mask & br)
            call.notes.append("bottom_right folded into mask")
    call.mask = mask
    call.bias = as_4d(case.bias)
    if case.q_lengths is not None:
        call.q_lengths = case.q_lengths.astype(np.int32)
    if case.kv_lengths is not None:
        call.kv_lengths = case.kv_lengths.astype(np.int32)
    return call
