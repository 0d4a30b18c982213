"""The SDPA calling convention that `--kernel=MODULE:ATTR` kernels implement.

    fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
       scale=None, enable_gqa=False) -> array

in (B, H, L, D) layout, with a bool `attn_mask` meaning True = attend and a
float `attn_mask` added to the scaled logits (torch's
`F.scaled_dot_product_attention`). What the convention cannot say directly is
folded into one explicit `attn_mask`: bottom-right causal, padding lengths,
and any mask combined with causal (torch's SDPA raises when both are given).
`is_causal=True` is used only for top-left causal with no other mask.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, visibility

SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def fold_mask(case: Case) -> tuple[np.ndarray | None, bool]:
    """(attn_mask, is_causal) for `case`: attn_mask is None, bool (True = attend) or float64 additive."""
    only_causal = (case.causal == "top_left" and case.mask is None and case.bias is None
                   and case.q_lengths is None and case.kv_lengths is None)
    if only_causal:
        return None, True
    if case.causal is None and case.q_lengths is None and case.kv_lengths is None:
        if case.bias is None:
            return case.mask, False
        if case.mask is None:
            return case.bias, False
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    vis = visibility(full, mask=case.mask, causal=case.causal,
                     q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
    if case.bias is None:
        return _squeeze_heads(vis), False
    return np.where(vis, np.broadcast_to(case.bias, full), -np.inf), False


def _squeeze_heads(vis: np.ndarray) -> np.ndarray:
    """Keep a (B, 1, Lq, Lk) mask when it does not vary over heads (smaller, and tests broadcasting)."""
    if vis.shape[1] > 1 and (vis == vis[:, :1]).all():
        return vis[:, :1]
    return vis
