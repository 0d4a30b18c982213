"""Alternatives (`instead`) for spec/divergences/onnx.toml that the shared vocabulary lacks.

Registered with `conformance.alternatives.alternative`, like the shared ones: each judges the covered
elements of a result and returns a Verdict. conformance/regions_onnx.py imports this module, so
`regions.load_all()` registers them. Where the behaviour is "the reference of a nearby problem" the
nearby Case is built here and judged with its own reference and baseline (`alternatives._judge_against`);
the functions `*_case` and `*_expected` are exposed for tests and reports.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import tolerance as T
from attnconf.conformance.alternatives import FORWARD, Verdict, _exact, _judge_against, _judged, alternative
from attnconf.reference import Case, expand_kv, numpy_dtype, oracle


# ---- MultiHeadAttention: the last row skipped by the causal loop ---------------------------------

def causal_lifted_case(case: Case) -> Case:
    """The case without its causal mask: what MultiHeadAttention computes on the rows it forgets to mask."""
    return case.replace(causal=None)


@alternative("causal_lifted_last_row", FORWARD)
def _causal_lifted_last_row(entry, case, res, masks) -> Verdict:
    """The covered rows (the last query row, region mha_causal_last_row) see every key the other masks,
    the padding and the bias leave them: the reference without the causal mask, on those rows."""
    return _judge_against(causal_lifted_case(case), case, res, masks)


# ---- onnx's reference evaluator: causal frontier of row 0 ------------------------------------------

def first_row_frontier_case(case: Case) -> Case:
    """The case with its causal mask replaced by the frontier of query row 0 for every row (j <= offset,
    the spec's offset for the case's alignment), composed with its own mask."""
    s = case.shape
    B, Hq, Lq, Lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    ql = np.full(B, Lq) if case.q_lengths is None else case.q_lengths
    kl = np.full(B, Lk) if case.kv_lengths is None else case.kv_lengths
    off = np.zeros(B, dtype=np.int64) if case.causal == "top_left" else (kl - ql).astype(np.int64)
    frontier = np.broadcast_to(np.arange(Lk)[None, None, None, :] <= off[:, None, None, None], (B, 1, Lq, Lk))
    mask = frontier if case.mask is None else np.logical_and(np.broadcast_to(case.mask, (B, Hq, Lq, Lk)), frontier)
    return case.replace(causal=None, mask=mask)


@alternative("causal_frontier_of_first_row", FORWARD)
def _causal_frontier_of_first_row(entry, case, res, masks) -> Verdict:
    """What onnx's reference evaluator computes when attn_mask broadcasts over the query axis: it takes
    q_sequence_length from the mask's shape, so every query row gets row 0's causal frontier."""
    return _judge_against(first_row_frontier_case(case), case, res, masks)


# ---- the scale as Cast(Sqrt(scale), T1) ---------------------------------------------------------------

def effective_scale_case(case: Case) -> Case:
    """The case with the scale and softcap onnx's reference evaluator applies: Q and K are each multiplied
    by sqrt(scale) cast to the input dtype, where a given scale is the float32 attribute and its root is
    taken in float32, and the default 1/sqrt(head_size) is taken in float64; the softcap is the float32
    attribute. The effective scale is that root squared (in bfloat16 up to 0.4% off)."""
    root = np.sqrt(np.float32(case.scale)) if case.scale is not None else np.sqrt(1.0 / np.sqrt(case.shape["Dk"]))
    with np.errstate(invalid="ignore"):
        r = float(np.asarray(root).astype(numpy_dtype(case.dtype)).astype(np.float64))
    softcap = None if case.softcap is None else float(np.float32(case.softcap))
    return case.replace(scale=r * r, softcap=softcap)


def function_body_scale_case(case: Case) -> Case:
    """The case with the scale of the operator's ONNX function body as onnxruntime runs it for float64 (it
    has no float64 kernel and inlines the body): scale, or 1/sqrt(head_size), and its root in float32,
    cast to the input dtype; the softcap is the float32 attribute."""
    s32 = np.float32(case.scale) if case.scale is not None else np.float32(1.0) / np.sqrt(np.float32(case.shape["Dk"]))
    with np.errstate(invalid="ignore"):
        r = float(np.sqrt(s32).astype(numpy_dtype(case.dtype)).astype(np.float64))
    softcap = None if case.softcap is None else float(np.float32(case.softcap))
    return case.replace(scale=r * r, softcap=softcap)


@alternative("sqrt_scale_in_dtype", FORWARD, numeric=True)
def _sqrt_scale_in_dtype(entry, case, res, masks) -> Verdict:
    """The spec's tolerance model for the problem with the effective scale (effective_scale_case): its
    reference and its baseline (the baseline's sqrt(scale)-on-Q-and-K variant is then the evaluator's
    arithmetic)."""
    return _judge_against(effective_scale_case(case), case, res, masks)


@alternative("function_body_scale", FORWARD, numeric=True)
def _function_body_scale(entry, case, res, masks) -> Verdict:
    """The spec's tolerance model for the problem with the function body's scale (function_body_scale_case)."""
    return _judge_against(function_body_scale_case(case), case, res, masks)


# ---- onnxruntime's float16 Attention: the additive sentinel -----------------------------------------

def ort_f16_sentinel_expected(case: Case) -> dict[str, np.ndarray]:
    """What onnxruntime's float16 Attention computes when it masks by addition: at a position hidden by the
    mask, a -inf bias, the causal frontier or the window the logit is float16(float32(s q.k) - 65504)
    (+inf when that overflows, which turns the row NaN); a key past nonpad_kv_seqlen gets -65504 itself;
    visible logits are the reference's. Softmax in float64 over every key of the row."""
    from attnconf.conformance.regions_onnx import _hidden_added, _ort_f16_masked_logits  # noqa: PLC0415

    f = oracle(case)
    e = _ort_f16_masked_logits(case)
    if e is None:
        return {"out": f.out, "lse": f.lse}
    added = _hidden_added(case)
    with np.errstate(all="ignore"):
        lg = np.where(f.visible, f.logits, np.where(added, e, -65504.0))
        m = lg.max(axis=-1, keepdims=True)
        p = np.exp(lg - m)
        den = p.sum(axis=-1, keepdims=True)
        out = np.einsum("bhij,bhjd->bhid", p / den, expand_kv(case.v, case.shape["Hq"]))
        lse = (m + np.log(den))[..., 0]
    return {"out": out, "lse": lse}


@alternative("ort_f16_additive_sentinel", FORWARD)
def _ort_f16_additive_sentinel(entry, case, res, masks) -> Verdict:
    """Covered rows whose sentinel sum overflows are NaN; the others are the softmax over the sentinel
    logits (ort_f16_sentinel_expected), judged with the case's baseline error and the rounding floor at
    the expected output's magnitude."""
    from attnconf.reference import baseline_error  # noqa: PLC0415

    if "out" not in masks:
        return Verdict(True)
    expected = ort_f16_sentinel_expected(case)["out"]
    nan_rows = masks["out"] & np.isnan(expected)
    v = _exact("out", np.asarray(res.out), nan_rows, np.isnan, "NaN")
    if not v.ok:
        return v
    finite = masks["out"] & ~np.isnan(expected)
    if not finite.any():
        return Verdict(True)
    return _judged(T.judge_arrays(np.asarray(res.out), np.where(np.isnan(expected), 0.0, expected),
                                  baseline_error(case)[0], case.dtype, quantity="out (additive sentinel)",
                                  mask=finite))
