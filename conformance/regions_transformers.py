"""Regions of the transformers backend (spec/divergences/transformers.toml).

Row regions return a (B, Hq, Lq) bool array of covered query rows, as conformance/regions.py describes.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance.regions import region
from attnconf.reference import Case, oracle, visibility


def _mask_hidden_keys(case: Case) -> np.ndarray:
    s = case.shape
    return ~visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                       q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                       window_align=case.window_align)


@region
def mask_emptied_rows_with_bias(case: Case) -> np.ndarray:
    """Empty rows with a key hidden by the boolean mask, causal alignment, a window or padding, in a case
    that has a bias. transformers' sdpa merges a boolean mask with a float bias (`position_bias`) into
    `torch.where(mask, bias, finfo.min)` (integrations/sdpa_attention.py, create_position_bias_mask), so
    only then do its empty rows see finite logits; without a bias the boolean mask reaches torch's SDPA
    and the rows come out 0 as the spec says."""
    s = case.shape
    if case.bias is None:
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    empty = ~oracle(case).visible.any(axis=-1)
    return empty & _mask_hidden_keys(case).any(axis=-1)
