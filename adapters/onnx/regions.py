"""Regions for adapters/onnx/divergences.toml (the `onnx` backend, adapters/onnx/adapter.py).

Each predicate takes a Case and returns a bool (a case region, registered with @case_region) or a
(B, Hq, Lq) bool array of covered rows (@region). Importing this module (regions.load_all does) also
registers the alternatives of adapters/onnx/alternatives.py. Where a region depends on how the adapter lays a case out (which mask shape reaches
the operator, whether `unidirectional` is used), it asks the adapter's own mapping in
adapters/onnx/graphs.py, so the region and the call cannot drift apart.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.onnx.graphs import Inexpressible, attention_call, mha_call
from attnconf.conformance.engine.regions import case_region, region
from attnconf.reference import Case, oracle
from attnconf.spec.vocabulary import HALF_DTYPES


@case_region
def zero_scale(case: Case) -> bool:
    """A custom scale of exactly 0: the contrib operators' attribute default, which they read as 'not given'."""
    return getattr(case, "scale", None) == 0


@case_region
def negative_scale(case: Case) -> bool:
    """A custom scale below 0 (ATTN-OP-4 allows any finite scale)."""
    scale = getattr(case, "scale", None)
    return scale is not None and scale < 0


@region
def negative_scale_rows_seeing_a_key(case: Case) -> np.ndarray:
    """In a case with a custom scale below 0, the rows that see a key: a row the mask empties is
    zeroed whatever its logits (measured: onnx's reference and onnxruntime's float64 body give 0 there)."""
    if not negative_scale(case):
        s = case.shape
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    return oracle(case).visible.any(axis=-1)


@case_region
def nonpositive_scale(case: Case) -> bool:
    """A custom scale of 0 or below: onnxruntime's Attention kernel enforces `scale > 0`."""
    scale = getattr(case, "scale", None)
    return scale is not None and scale <= 0


@case_region
def attn_mask_broadcasts_queries(case: Case) -> bool:
    """The attn_mask that reaches the standard Attention operator has rank 1, or a query axis of size 1
    while Lq > 1 (broadcast over queries, as ATTN-MASK-1 and the ONNX schema allow)."""
    if not hasattr(case, "q") or case.q.ndim != 4:
        return False
    try:
        m = attention_call(case).feeds.get("attn_mask")
    except Inexpressible:
        return False
    return m is not None and (m.ndim < 2 or (m.shape[-2] == 1 and case.shape["Lq"] > 1))


def _mha_lifted_last_row(case: Case) -> np.ndarray | None:
    """(B, Hq) whether MultiHeadAttention's last query row, which its causal loop skips when
    kv_sequence_length > sequence_length, still sees a key once the causal mask is lifted. None where
    unidirectional is not used natively or Lk <= Lq."""
    if not hasattr(case, "q") or case.q.ndim != 4 or case.causal is None:
        return None
    try:
        call = mha_call(case)
    except Inexpressible:
        return None
    s = case.shape
    if call.attrs.get("unidirectional") != 1 or s["Lk"] <= s["Lq"]:
        return None
    from attnconf.reference import visibility  # noqa: PLC0415

    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    lifted = visibility(full, mask=case.mask, bias=case.bias, q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
    return lifted[:, :, -1, :].any(axis=-1)


@region
def mha_causal_last_row(case: Case) -> np.ndarray | bool:
    """Rows of com.microsoft.MultiHeadAttention that its `unidirectional` mask skips: the last query row
    when the adapter passes the causal mask natively (offset 0) and there are more keys than queries, where
    that row sees some key once the causal mask is lifted (otherwise it is NaN: mha_rows_emptied_by_infinite_masks)."""
    last = _mha_lifted_last_row(case)
    if last is None or not last.any():
        return False
    s = case.shape
    rows = np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    rows[:, :, -1] = last
    return rows


# ---- float16 logits at hidden positions ----------------------------------------
F16_LOWEST = -65504.0   # onnxruntime's mask_filter_value<MLFloat16>(): the finite sentinel a masked logit gets


def _hidden_added(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk) positions that onnxruntime's Attention hides by *adding* its sentinel (mask, -inf bias,
    causal frontier, window, folded query padding); keys past nonpad_kv_seqlen are overwritten instead."""
    s = case.shape
    hidden = ~oracle(case).visible
    if case.kv_lengths is not None:
        keep = np.arange(s["Lk"])[None, :] < case.kv_lengths[:, None]
        hidden &= keep[:, None, None, :]
    return hidden


def _ort_f16_masked_logits(case: Case) -> np.ndarray | None:
    """What onnxruntime's float16 Attention holds at each position after adding the mask: the scaled
    logit, computed in float32 (its fp16 GEMM falls back to SGEMM on CPUs without fp16 GEMM), plus the
    sentinel -65504 at hidden positions, rounded once to float16; -inf where a float attn_mask adds -inf
    (_float_mask_minus_inf)."""
    if getattr(case, "dtype", None) != "float16" or not hasattr(case, "q") or case.q.ndim != 4:
        return None
    if case.softcap is not None:   # the softcap path runs the GEMM without the mask; tanh bounds the logit
        return None
    from attnconf.reference import expand_kv  # noqa: PLC0415

    key = ("ort_f16_masked_logits",)      # the region and the alternative both need it for each case
    if key not in case._cache:
        s = case.shape
        q32 = case.q.astype(np.float32)
        k32 = expand_kv(case.k, s["Hq"]).astype(np.float32)
        with np.errstate(all="ignore"):
            logit = np.float32(case.effective_scale) * np.einsum("bhid,bhjd->bhij", q32, k32)
            e = (logit + np.float32(F16_LOWEST)).astype(np.float16).astype(np.float64)
        case._cache[key] = np.where(_float_mask_minus_inf(case), -np.inf, e)
    return case._cache[key]


def _float_mask_minus_inf(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk) positions where onnxruntime adds -inf, not its sentinel: a float attn_mask (the
    adapter sends one when the case has a bias) carries -inf there and the operator's own causal frontier
    or window, which overwrites the mask with the sentinel, does not reach it."""
    s = case.shape
    none = np.zeros((s["B"], s["Hq"], s["Lq"], s["Lk"]), dtype=bool)
    try:
        call = attention_call(case)
    except Inexpressible:
        return none
    m = call.feeds.get("attn_mask")
    if m is None or m.dtype == bool:
        return none
    from attnconf.reference import visibility  # noqa: PLC0415

    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    lengths = dict(q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
    padded = ~visibility(full, **lengths)      # the adapter folds query padding into the mask: not the operator's
    own = np.zeros(full, dtype=bool)
    if "is_causal" in call.attrs:       # the adapter gives the operator a frontier only where it is the spec's
        own |= ~visibility(full, causal=case.causal, **lengths) & ~padded
    if "left_window_size" in call.attrs:
        own |= ~visibility(full, window=case.window, window_align=case.window_align, **lengths) & ~padded
    return np.broadcast_to(np.isneginf(np.asarray(m, np.float64)), full) & ~own


def _ort_f16_scores(case: Case) -> np.ndarray | None:
    """(B, Hq, Lq, Lk) the float16 scores onnxruntime's float16 Attention holds before its softmax (which
    runs in float32 on them, core/providers/cpu/llm/attention_softmax.h): at a visible key the scaled logit
    in float32 plus the float attn_mask's bias, rounded once to float16 (+-inf beyond +-65504); at a key
    hidden by addition _ort_f16_masked_logits; at a key past nonpad_kv_seqlen the sentinel -65504 itself.
    None where _ort_f16_masked_logits is."""
    e = _ort_f16_masked_logits(case)
    if e is None:
        return None
    key = ("ort_f16_scores",)
    if key not in case._cache:
        from attnconf.reference import expand_kv  # noqa: PLC0415

        s = case.shape
        f = oracle(case)
        bias = np.zeros(f.visible.shape) if case.bias is None else np.broadcast_to(case.bias, f.visible.shape)
        with np.errstate(all="ignore"):
            logit = np.float32(case.effective_scale) * np.einsum(
                "bhid,bhjd->bhij", case.q.astype(np.float32), expand_kv(case.k, s["Hq"]).astype(np.float32))
            seen = (logit + np.where(f.visible, bias, 0.0).astype(np.float32)).astype(np.float16).astype(np.float64)
        case._cache[key] = np.where(f.visible, seen, np.where(_hidden_added(case), e, F16_LOWEST))
    return case._cache[key]


@region
def ort_f16_masked_logit_survives_sentinel(case: Case) -> np.ndarray | bool:
    """float16 rows where a key that onnxruntime's Attention hides (by adding -65504, or past nonpad_kv_seqlen
    by holding -65504) keeps a score within 40 of the row's largest visible float16 score, or above it (the
    masked key takes weight), or so large that logit - 65504 still rounds to +inf (the row becomes NaN).
    Needs scaled logits beyond ~65000: a hidden one that large, or visible ones all near or below -65504."""
    sc = _ort_f16_scores(case)
    if sc is None:
        return False
    f = oracle(case)
    with np.errstate(invalid="ignore"):
        top = np.where(f.visible, sc, -np.inf).max(axis=-1, keepdims=True)
        rows = (~f.visible & ((sc > top - 40.0) | np.isposinf(sc))).any(axis=-1)
    rows &= f.visible.any(axis=-1)      # a row that sees no key still comes out 0 (measured)
    return rows if rows.any() else False


@region
def ort_f16_logit_overflow_rows(case: Case) -> np.ndarray | bool:
    """float16 rows that see a key where onnxruntime's Attention holds +inf at a visible key (its scaled,
    biased logit rounds past 65504 to float16), or -inf at every key (visible ones below -65504 and no
    hidden key holding a finite sentinel): its softmax makes such a row NaN (_ort_f16_scores)."""
    sc = _ort_f16_scores(case)
    if sc is None:
        return False
    f = oracle(case)
    rows = (np.isposinf(sc) & f.visible).any(axis=-1) | np.isneginf(sc).all(axis=-1)
    rows &= f.visible.any(axis=-1)
    return rows if rows.any() else False


def ref_f16_logits(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk) the logits onnx's reference evaluator forms in float16, before its bias: (Q * sqrt(s))
    @ (K * sqrt(s))^T with NumPy in float16, exactly as it does (+-inf beyond 65504), then the softcap."""
    from attnconf.reference import expand_kv  # noqa: PLC0415

    s = case.shape
    root = np.sqrt(np.float32(case.scale)) if case.scale is not None else np.sqrt(1.0 / np.sqrt(s["Dk"]))
    with np.errstate(all="ignore"):
        r16 = np.float16(root)
        qs = case.q.astype(np.float16) * r16
        ks = expand_kv(case.k, s["Hq"]).astype(np.float16) * r16
        logit = np.matmul(qs, np.swapaxes(ks, -1, -2))
        if case.softcap is not None:
            c = np.float32(case.softcap)
            logit = np.tanh(logit / c) * c
    return logit


def ref_f16_overflow_rows(case: Case, visible: np.ndarray) -> np.ndarray:
    """(B, Hq, Lq): rows where onnx's reference evaluator meets +inf + (-inf) = NaN in float16, for the
    given visibility: a hidden key whose float16 logit (ref_f16_logits) is +inf gets the -inf bias
    afterwards; its guard zeroes rows that see no key."""
    return (np.isposinf(ref_f16_logits(case)) & ~visible).any(axis=-1) & visible.any(axis=-1)


@region
def ref_f16_hidden_logit_overflow(case: Case) -> np.ndarray | bool:
    """float16 rows where onnx's reference evaluator meets +inf + (-inf) = NaN: a hidden key whose float16
    logit overflows poisons its row (ref_f16_overflow_rows). Cases the causal-frontier entries cover are
    theirs (their alternative models this too)."""
    if getattr(case, "dtype", None) != "float16" or not hasattr(case, "q") or case.q.ndim != 4:
        return False
    if _ref_other_entries(case):
        return False
    rows = ref_f16_overflow_rows(case, oracle(case).visible)
    return rows if rows.any() else False


@region
def ref_f16_logit_overflow_rows(case: Case) -> np.ndarray | bool:
    """float16 rows that see a key where onnx's reference evaluator's float16 logit plus bias (ref_f16_logits,
    the sum in float16) is +inf at a visible key (the row comes out NaN), or -inf at every visible key (its
    softmax zeroes a row whose largest logit is -inf). Rows of ref_f16_hidden_logit_overflow, and cases the
    causal-frontier entries cover, are theirs."""
    if getattr(case, "dtype", None) != "float16" or not hasattr(case, "q") or case.q.ndim != 4:
        return False
    if _ref_other_entries(case):
        return False
    f = oracle(case)
    logit = ref_f16_logits(case)
    bias = 0.0 if case.bias is None else np.where(f.visible, np.broadcast_to(case.bias, f.visible.shape), 0.0)
    with np.errstate(all="ignore"):
        scores = np.where(f.visible, logit + np.asarray(bias).astype(logit.dtype), -np.inf)
    rows = (np.isposinf(scores).any(axis=-1) | np.isneginf(scores).all(axis=-1)) & f.visible.any(axis=-1)
    rows &= ~ref_f16_overflow_rows(case, f.visible)
    return rows if rows.any() else False


# ---- onnx's reference evaluator: its causal frontier and its scale ---------------
def _ref_causal_mask(case: Case) -> np.ndarray | None:
    """The attn_mask that reaches the reference evaluator when it applies is_causal itself, else None."""
    if not hasattr(case, "q") or case.q.ndim != 4 or case.causal is None:
        return None
    try:
        call = attention_call(case, weights=True)
    except Inexpressible:
        return None
    if call.attrs.get("is_causal") != 1 or "left_window_size" in call.attrs:
        return None
    return call.feeds.get("attn_mask")


@case_region
def ref_causal_rank1_mask(case: Case) -> bool:
    """is_causal with a rank-1 attn_mask: the reference evaluator unpacks the mask's last two axes as
    (q, kv) and raises."""
    m = _ref_causal_mask(case)
    return m is not None and m.ndim == 1


@case_region
def ref_causal_mask_broadcasts_queries(case: Case) -> bool:
    """is_causal with an attn_mask whose query axis is 1 while Lq > 1: the reference evaluator builds the
    causal frontier from the mask's shape, so every query row gets row 0's frontier."""
    m = _ref_causal_mask(case)
    return m is not None and m.ndim >= 2 and m.shape[-2] == 1 and case.shape["Lq"] > 1


def _ref_other_entries(case: Case) -> bool:
    """A case another reference-evaluator entry covers whole (NaN scale, causal frontier from the mask)."""
    return negative_scale(case) or ref_causal_rank1_mask(case) or ref_causal_mask_broadcasts_queries(case)


@case_region
def ort_float64_function_body(case: Case) -> bool:
    """float64 cases onnxruntime runs through Attention's function body, except those with a negative scale
    (the body's Sqrt makes them NaN: ONNX-ORT-ATTN-F64-NEGATIVE-SCALE-NAN)."""
    return getattr(case, "dtype", None) == "float64" and not negative_scale(case)


@case_region
def float64_scale_or_softcap_attribute(case: Case) -> bool:
    """float64 cases with a custom scale or a softcap: ONNX carries both as float32 attributes. Cases that
    ONNX-REF-NEGATIVE-SCALE-NAN or the causal-frontier entries cover are theirs."""
    return (getattr(case, "dtype", None) == "float64" and hasattr(case, "softcap")
            and (case.scale is not None or case.softcap is not None) and not _ref_other_entries(case))


@region
def ref_half_precision_rows(case: Case) -> np.ndarray | bool:
    """Every row of a float16 or bfloat16 case, except rows and cases other reference-evaluator entries
    cover (hidden-logit and visible-logit overflow rows; negative scale; causal frontier from the mask)."""
    if getattr(case, "dtype", None) not in HALF_DTYPES or not hasattr(case, "q") or case.q.ndim != 4:
        return False
    if _ref_other_entries(case):
        return False
    s = case.shape
    rows = np.ones((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    for other in (ref_f16_hidden_logit_overflow(case), ref_f16_logit_overflow_rows(case)):
        if not isinstance(other, bool):
            rows &= ~other
    return rows


# ---- MultiHeadAttention: rows that see no key ---------------------------------------------------
def _mha_causal_only_keys(case: Case) -> np.ndarray | None:
    """(B, Hq, Lq, Lk) keys to which MultiHeadAttention gives its finite causal sentinel (lowest()) when
    `unidirectional` is used: keys behind the causal frontier of rows 0 .. Lq-2 (its loop skips the last
    row) and not hidden by what the adapter passes as -inf in attention_bias (mask, bias, folded query
    padding). The sentinel is *assigned*, so it overwrites key padding (-inf) there. None where
    unidirectional is not used."""
    if not hasattr(case, "q") or case.q.ndim != 4 or case.causal is None:
        return None
    try:
        call = mha_call(case)
    except Inexpressible:
        return None
    if call.attrs.get("unidirectional") != 1:
        return None
    from attnconf.reference import visibility  # noqa: PLC0415

    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    from attnconf.reference.attention import causal_visible  # noqa: PLC0415

    others = visibility(full, mask=case.mask, bias=case.bias, q_lengths=case.q_lengths)
    keys = np.zeros(full, dtype=bool)
    for b in range(s["B"]):
        ql = None if case.q_lengths is None else int(case.q_lengths[b])
        kl = None if case.kv_lengths is None else int(case.kv_lengths[b])
        keys[b] = others[b] & ~causal_visible(s["Lq"], s["Lk"], case.causal, ql, kl)[None]
    keys[:, :, -1, :] = False
    return keys


@region
def mha_rows_emptied_with_causal_keys(case: Case) -> np.ndarray | bool:
    """Rows that see no key where some key carries MultiHeadAttention's finite causal sentinel (lowest(),
    _mha_causal_only_keys): such a row averages those keys' values."""
    keys = _mha_causal_only_keys(case)
    if keys is None:
        return False
    rows = ~oracle(case).visible.any(axis=-1) & keys.any(axis=-1)
    return rows if rows.any() else False


@region
def mha_rows_emptied_by_infinite_masks(case: Case) -> np.ndarray | bool:
    """Rows that see no key, every key hidden by an infinite mask (-inf attention_bias, padding with
    mask_filter_value = -inf, folded query padding): MultiHeadAttention returns NaN there."""
    if not hasattr(case, "q") or case.q.ndim != 4:
        return False
    rows = ~oracle(case).visible.any(axis=-1)
    keys = _mha_causal_only_keys(case)
    if keys is not None:
        rows &= ~keys.any(axis=-1)
    last = _mha_lifted_last_row(case)
    if last is not None:
        rows[:, :, -1] &= ~last
    return rows if rows.any() else False


