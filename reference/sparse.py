"""DeepSeek sparse attention (top-k key indices per query) in float64 (ATTN-SPARSE-1..3).

A query attends to the *set* of its valid indices: -1 and every index >= the number of keys
are invalid, order does not matter, and an index listed twice counts once (ATTN-SPARSE-1: the
spec's choice; FlashMLA's `tests/ref.py` gathers the indices as listed and would count it
twice). The set becomes a boolean mask over the keys and the dense reference does the rest,
so everything else (scale, sinks, the empty row) is the dense spec's.

`max_logits` is the largest scaled logit over the set, -inf for an empty set (ATTN-SPARSE-3).
"""
from __future__ import annotations

import numpy as np

from .attention import Forward, forward


def index_mask(indices: np.ndarray, n_keys: int) -> np.ndarray:
    """(..., topk) integer indices -> (..., n_keys) bool: key j is in the row's set of valid indices."""
    idx = np.asarray(indices)
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"indices must be integers; got {idx.dtype}")
    valid = (idx >= 0) & (idx < n_keys)
    mask = np.zeros(idx.shape[:-1] + (n_keys,), dtype=bool)
    rows = np.nonzero(valid)
    mask[rows[:-1] + (idx[rows],)] = True
    return mask


def sparse_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, indices: np.ndarray, **params) -> Forward:
    """q (B, Hq, Lq, D), k, v (B, Hkv, Lk, D), indices (B, Hkv, Lq, topk): every query head of a KV head
    uses that KV head's indices. Other parameters as `reference.forward` (a mask there is intersected)."""
    hq, hkv = q.shape[1], k.shape[1]
    mask = np.repeat(index_mask(indices, k.shape[2]), hq // hkv, axis=1)
    if params.get("mask") is not None:
        mask = mask & np.asarray(params.pop("mask"), dtype=bool)
    params.pop("mask", None)
    return forward(q, k, v, mask=mask, **params)


def max_logits(f: Forward) -> np.ndarray:
    """The largest visible logit of each row, -inf where the row sees no key (ATTN-SPARSE-3)."""
    masked = np.where(f.visible, f.logits, -np.inf)
    return masked.max(axis=-1) if masked.shape[-1] else np.full(masked.shape[:-1], -np.inf)
