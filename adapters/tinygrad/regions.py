"""Regions for adapters/tinygrad/divergences.toml (tinygrad's Tensor.scaled_dot_product_attention).

tinygrad 0.14 computes `qk.cast(q.dtype).softmax(-1) @ v` with the plain softmax
`e = exp(x - max(x)); e / sum(e)` (tinygrad/mixin/op.py `_softmax`, `softmax`). A query row
whose logits are all -inf (a fully-masked row), or whose largest logit is +inf, therefore
gives `-inf - (-inf)` or `inf - inf` = NaN in every weight of the row, and the NaN row of P
reaches the gradients: dQ of the row, dBias of the row, and through `dV = P^T dO` and
`dK = dS^T Q` every row of dK and dV of the key/value head the row belongs to.

`nan_rows(case)` is the (B, Hq, Lq) set of rows that come out NaN; the regions below are built
on it, and `adapters/tinygrad/alternatives.py` uses it for the gradient alternative.
Measured: tinygrad 0.14.0, CPU device, clang renderer (Debian clang 14.0.6).
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, oracle

from attnconf.conformance.engine.regions import region

# float16's largest finite value is 65504; round-to-nearest sends everything from 65520 up to inf.
F16_OVERFLOW = 65520.0


def _rows_shape(case: Case) -> tuple[int, int, int]:
    s = case.shape
    return (s["B"], s["Hq"], s["Lq"])


def empty_rows(case: Case) -> np.ndarray:
    """(B, Hq, Lq): rows that see no key (mask, -inf bias, causal alignment, padding), in cases with
    more than one key; with a single key tinygrad's softmax gives that key weight 1 whatever hides it
    (`single_key_empty_rows`)."""
    if case.shape["Lk"] == 1:
        return np.zeros(_rows_shape(case), dtype=bool)
    vis = oracle(case).visible
    return np.broadcast_to(~vis.any(axis=-1), _rows_shape(case)).copy()


@region
def single_key_empty_rows(case: Case) -> np.ndarray | bool:
    """Rows that see no key in cases with Lk = 1 (mask, -inf bias, causal alignment, padding), without dropout."""
    if hasattr(case, "num_heads") or case.shape["Lk"] != 1 or case.dropout_p:
        return False
    vis = oracle(case).visible
    return np.broadcast_to(~vis.any(axis=-1), _rows_shape(case)).copy()


@region
def fully_masked_rows_of_several_keys(case: Case) -> np.ndarray | bool:
    """Rows that see no key, in cases with Lk > 1 (where tinygrad's softmax gives them NaN)."""
    if hasattr(case, "num_heads"):
        return False
    return empty_rows(case)


def float16_overflow_rows(case: Case) -> np.ndarray:
    """(B, Hq, Lq): float16 rows whose scaled, biased logits round to +-inf when tinygrad casts them to
    float16 (`qk.cast(self.dtype)`): the largest visible logit reaches 65520, or every visible logit
    reaches -65520 (then the row is all -inf, as if fully masked)."""
    shape = _rows_shape(case)
    if case.dtype != "float16":
        return np.zeros(shape, dtype=bool)
    f = oracle(case)
    with np.errstate(invalid="ignore"):
        top = np.where(f.visible, f.logits, -np.inf).max(axis=-1, initial=-np.inf)
    seen = f.visible.any(axis=-1)
    return np.broadcast_to(seen & ((top >= F16_OVERFLOW) | (top <= -F16_OVERFLOW)), shape).copy()


def nan_rows(case: Case) -> np.ndarray:
    """(B, Hq, Lq): every row tinygrad's SDPA returns as NaN (measured; see the module docstring)."""
    return empty_rows(case) | float16_overflow_rows(case)


@region
def float16_scaled_logit_overflow_rows(case: Case) -> np.ndarray | bool:
    """Rows of a float16 case whose largest visible scaled logit s q.k + bias is >= 65520 (or whose
    visible logits are all <= -65520): they become +-inf when tinygrad casts the logits to float16."""
    if hasattr(case, "num_heads") or case.dtype != "float16":
        return False
    return float16_overflow_rows(case)


@region
def some_row_fully_masked(case: Case) -> bool:
    """Case level: some query row sees no key. A NaN row of P poisons the dK and dV of its key/value head."""
    if hasattr(case, "num_heads"):
        return False
    return bool(empty_rows(case).any())


@region
def float16_scaled_logit_overflow(case: Case) -> bool:
    """Case level: `float16_scaled_logit_overflow_rows` covers some row (for gradient entries)."""
    if hasattr(case, "num_heads") or case.dtype != "float16":
        return False
    return bool(float16_overflow_rows(case).any())


@region
def fully_masked_rows_without_dropout(case: Case) -> np.ndarray | bool:
    """Rows that see no key, in cases without dropout (where tinygrad returns them NaN)."""
    if hasattr(case, "num_heads") or case.dropout_p:
        return False
    return empty_rows(case)


@region
def fully_masked_rows_with_dropout(case: Case) -> np.ndarray | bool:
    """Rows that see no key, in cases with dropout (NaN, or 0 when every key of the row is dropped)."""
    if hasattr(case, "num_heads") or not case.dropout_p:
        return False
    return empty_rows(case)
