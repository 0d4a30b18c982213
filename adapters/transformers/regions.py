"""Regions of the transformers backend (adapters/transformers/divergences.toml).

Row regions return a (B, Hq, Lq) bool array of covered query rows, as conformance/engine/regions.py describes.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.transformers.alternatives import _scaled_logits, eager_softmax_input
from attnconf.conformance.engine.regions import case_region, region
from attnconf.reference import Case, oracle, visibility


def _mask_hidden_keys(case: Case) -> np.ndarray:
    s = case.shape
    return ~visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                       q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                       window_align=case.window_align)


def finfo_min_mask_rows(case: Case) -> np.ndarray:
    """(B, Hq, Lq) rows on which masking with finfo(dtype).min differs from masking with -inf:
    rows that see no key but have a key hidden by a boolean source (the mask, causal alignment, a window,
    padding), and rows where such a key's logit exceeds the row's largest visible logit by more than
    |finfo(dtype).min| - 40 (exp(-40) ~ 4e-18: below that a hidden key's weight is invisible in every
    dtype). The second kind happens only in float16 (|min| = 65504) with logits computed above float16."""
    f = oracle(case)
    hidden = _mask_hidden_keys(case)
    empty = ~f.visible.any(axis=-1)
    limit = {"float16": 65504.0}.get(case.dtype, float(np.finfo(np.float32).max))
    with np.errstate(all="ignore"):
        top_visible = np.where(f.visible, f.logits, -np.inf).max(axis=-1, keepdims=True, initial=-np.inf)
        raw = _scaled_logits(case)  # a hidden key's bias is replaced by the minimum, -inf included
        beats = hidden & np.isfinite(raw) & (raw - limit > top_visible - 40.0)
    return (empty & hidden.any(axis=-1)) | beats.any(axis=-1)


@region
def finfo_min_mask_rows_with_bias(case: Case) -> np.ndarray:
    """`finfo_min_mask_rows` in a case that has a bias. transformers' sdpa merges a boolean mask with a
    float bias (`position_bias`) into `torch.where(mask, bias, finfo.min)` (integrations/sdpa_attention.py,
    create_position_bias_mask), so only then do hidden keys reach torch as finite logits; without a bias
    the boolean mask reaches torch's SDPA and the rows conform."""
    s = case.shape
    if case.bias is None:
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    return finfo_min_mask_rows(case)


def _eager_float16_nan_rows(case: Case, *, sinks: bool) -> np.ndarray:
    s = case.shape
    if case.dtype != "float16":
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    x = eager_softmax_input(case)
    rows = (np.isposinf(x) | np.isnan(x)).any(axis=-1)
    return rows if sinks else rows | np.isneginf(x).all(axis=-1)


@region
def eager_float16_nan_rows(case: Case) -> np.ndarray:
    """float16 rows that llama's and gemma2's eager functions make NaN: `Q K^T` is formed in float16 before
    `* scaling`, so an unscaled dot product beyond +-65504 rounds to +-inf. A row is NaN with +inf anywhere (a
    visible key, or a hidden one: +inf - 65504 stays +inf), NaN anywhere (+-inf times a scale of 0), or -inf on
    every key (every logit below -65504, or every key hidden with logit - 65504 below it).
    `eager_softmax_input` is that softmax's input, step by step."""
    return _eager_float16_nan_rows(case, sinks=False)


@region
def eager_float16_nan_rows_sinks(case: Case) -> np.ndarray:
    """`eager_float16_nan_rows` in gpt-oss's eager function, whose softmax also holds the row's finite sink
    logit: a row of -inf logits gives the sink all the weight (finite), only +inf or NaN make the row NaN."""
    return _eager_float16_nan_rows(case, sinks=True)


@region
def finfo_min_mask_rows_eager(case: Case) -> np.ndarray:
    """`finfo_min_mask_rows`, for the eager functions, which add transformers' finfo.min mask (or a
    custom mask merged the same way) to their logits in every case."""
    return finfo_min_mask_rows(case)


def sliding_window_one_with_cache(case: Case) -> bool:
    """A case the adapter maps to `config.sliding_window = 1` with a KV cache: window (0, r) under causal
    masking or (0, 0) (so `create_sliding_window_causal_mask(sliding_window=1)`) and Lk > Lq (P = Lk - Lq
    keys already in the DynamicCache). DynamicSlidingWindowLayer.update keeps `full[:, :, -sliding_window + 1:]`,
    which for sliding_window = 1 is `full[:, :, 0:]`, every key, while get_mask_sizes() advertises
    sliding_window - 1 + Lq = Lq keys to the mask: the mask has Lq columns, the keys P + Lq."""
    if case.window is None or tuple(case.window) == (-1, -1):
        return False
    left, right = case.window
    causal_like = case.causal is not None or right == 0
    return bool(causal_like and left == 0 and case.shape["Lk"] > case.shape["Lq"])


@case_region
def sliding_window_one_cache(case: Case) -> bool:
    """`sliding_window_one_with_cache` as a case region, prefill and decoding alike: flex_attention checks the
    BlockMask's (Lq, Lq) size against the P + Lq keys and raises instead of broadcasting a decode mask."""
    return sliding_window_one_with_cache(case)


@case_region
def sliding_window_one_cache_prefill(case: Case) -> bool:
    """`sliding_window_one_with_cache` with Lq > 1: the Lq-column mask cannot broadcast over P + Lq keys."""
    return sliding_window_one_with_cache(case) and case.shape["Lq"] > 1


@region
def sliding_window_one_cache_decode(case: Case) -> np.ndarray:
    """`sliding_window_one_with_cache` with Lq = 1 (decoding): the one-column mask broadcasts over all P + 1
    keys. Covers the rows that see a key (their one mask entry, key Lk - 1, is visible, so every key is)."""
    s = case.shape
    if not (sliding_window_one_with_cache(case) and s["Lq"] == 1):
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    return oracle(case).visible.any(axis=-1)


@region
def nonpositive_scale_sdpa_is_causal(case: Case) -> np.ndarray | bool:
    """With a custom scale <= 0, causal masking of a square problem (top-left and bottom-right coincide) and
    nothing else hiding keys, transformers' sdpa_attention_forward builds no mask and passes is_causal=True to
    F.scaled_dot_product_attention (Lq > 1): the rows causal masking hides some key from, where torch's CPU
    flash path goes NaN (torch's `nonpositive_scale_is_causal`, which covers top-left only)."""
    s = case.shape
    if not (case.scale is not None and case.scale <= 0 and case.causal is not None and s["Lq"] == s["Lk"] > 1
            and case.mask is None and case.bias is None and case.q_lengths is None and case.kv_lengths is None
            and case.window is None):
        return False
    return ~oracle(case).visible.all(axis=-1)
