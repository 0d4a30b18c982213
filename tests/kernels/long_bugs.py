"""Kernels exact below 4096 keys and wrong only above: the catalogue of ATTN-LONG-1.

Each follows the torch SDPA convention. Up to SHORT keys it is `tests.kernels.correct.naive`, so the
ordinary suite (lengths up to a few hundred) passes it; above, it walks the query rows in blocks of ROWS
against all keys (O(ROWS x L) memory), the way a long-context path does, with one defect that real
long paths have had: the scale 1/d where 1/sqrt(d) belongs, a key index that wraps at 2^14, a causal
bound one key too far, a shortcut to the mean of V, keys beyond the last 4096 dropped. `long_control` is
the same blocked path without a defect. Only `--long -k test_long_sequences` can tell them apart
(tests/test_long_catalogue.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from .correct import apply_masks, dropout, inputs, naive, softmax, softmax_scale, weighted_values

SHORT = 4096
ROWS = 512
ALIAS_AT = 16384
BUGS: dict[str, Callable] = {}


def _blocked(defect: str | None):
    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if key.shape[-2] <= SHORT:
            return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        q, k, v = inputs(query, key, value, enable_gqa)
        lq, lk = q.shape[-2], k.shape[-2]
        sc = softmax_scale(q, scale)
        if defect == "scale_1_over_d" and scale is None:
            sc = 1.0 / q.shape[-1]
        if defect == "alias" and lk > ALIAS_AT:
            idx = torch.arange(lk, device=k.device) % ALIAS_AT
            k, v = k[..., idx, :], v[..., idx, :]
        mask = None if attn_mask is None else attn_mask.broadcast_to((*q.shape[:-2], lq, lk))
        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
        for i0 in range(0, lq, ROWS):
            i1 = min(i0 + ROWS, lq)
            # causal rows see no key past their last row (one more for the future-key defect): skip those
            kend = min(lk, i1 + 1) if is_causal and mask is None else lk
            rows = torch.arange(i0, i1, device=q.device)[:, None]
            cols = torch.arange(kend, device=q.device)[None, :]
            vis = torch.ones(i1 - i0, kend, dtype=torch.bool, device=q.device)
            if is_causal:                                   # top-left: key j visible to query i iff j <= i
                vis = cols <= rows + (1 if defect == "future_key" else 0)
            if defect == "last_4096":
                vis = vis & (cols > rows - SHORT)
            s = sc * (q[..., i0:i1, :] @ k[..., :kend, :].transpose(-2, -1))
            s, vis = apply_masks(s, None if mask is None else mask[..., i0:i1, :kend], False, vis)
            w = vis / vis.sum(dim=-1, keepdim=True).clamp(min=1) if defect == "uniform" else softmax(s, vis)
            out[..., i0:i1, :] = weighted_values(dropout(w.to(q.dtype), dropout_p), v[..., :kend, :])
        return out.to(query.dtype)

    return kernel


def _register(name: str, defect: str | None, doc: str) -> Callable:
    fn = _blocked(defect)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn.clause = "ATTN-LONG-1"
    if defect is not None:
        BUGS[name] = fn
    return fn


long_scale_1_over_d = _register(
    "long_scale_1_over_d", "scale_1_over_d",
    "Defect: above 4096 keys the default scale is 1/d, not 1/sqrt(d). Trips ATTN-LONG-1.")
long_positions_alias = _register(
    "long_positions_alias", "alias",
    "Defect: above 4096 keys, key positions past 16384 read the key and value 16384 places back (a 14-bit "
    "index). Trips ATTN-LONG-1.")
long_one_future_key = _register(
    "long_one_future_key", "future_key",
    "Defect: above 4096 keys, the causal bound lets every query see the key right after it. Trips ATTN-LONG-1.")
long_uniform_mean = _register(
    "long_uniform_mean", "uniform",
    "Defect: above 4096 keys, every row returns the plain mean of its visible values. Trips ATTN-LONG-1.")
long_last_4096_keys = _register(
    "long_last_4096_keys", "last_4096",
    "Defect: above 4096 keys, a row sees only the 4096 keys up to its own position. Trips ATTN-LONG-1.")
long_control = _register(
    "long_control", None,
    "The blocked long path without a defect: the correct control of the long catalogue.")
