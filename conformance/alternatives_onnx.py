"""Alternatives (`instead`) for spec/divergences/onnx.toml that the shared vocabulary lacks.

`def <name>(case) -> dict[str, np.ndarray]` returns the expected values per quantity on the whole
case; the divergence machinery compares them on the elements the entry's region covers.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, oracle
from attnconf.reference.attention import case_params, forward


def causal_lifted_last_row(case: Case) -> dict[str, np.ndarray]:
    """The reference, except that the last query row ignores the causal mask (every other mask, the
    padding and the bias still apply): what com.microsoft.MultiHeadAttention's `unidirectional`
    computes when kv_sequence_length > sequence_length (its mask loop stops one row early)."""
    ref = oracle(case)
    params = dict(case_params(case), causal=None)
    lifted = forward(case.q, case.k, case.v, **params)
    out, lse = ref.out.copy(), ref.lse.copy()
    out[:, :, -1] = lifted.out[:, :, -1]
    lse[:, :, -1] = lifted.lse[:, :, -1]
    return {"out": out, "lse": lse}


def causal_frontier_of_first_row(case: Case) -> dict[str, np.ndarray]:
    """The reference, except that every query row gets the causal frontier of row 0 (j <= offset, with
    the spec's offset for the case's alignment): what onnx's reference evaluator computes when the
    attn_mask broadcasts over the query axis (it takes q_sequence_length from the mask's shape)."""
    s = case.shape
    B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
    ql = np.full(B, Lq) if case.q_lengths is None else case.q_lengths
    kl = np.full(B, Lk) if case.kv_lengths is None else case.kv_lengths
    off = np.zeros(B, dtype=np.int64) if case.causal == "top_left" else (kl - ql)
    frontier = np.arange(Lk)[None, None, None, :] <= off[:, None, None, None]      # (B, 1, 1, Lk)
    frontier = np.broadcast_to(frontier, (B, 1, Lq, Lk))
    mask = frontier if case.mask is None else np.logical_and(np.broadcast_to(case.mask, (B, s["Hq"], Lq, Lk)), frontier)
    f = forward(case.q, case.k, case.v, **dict(case_params(case), causal=None, mask=mask))
    return {"out": f.out, "lse": f.lse}


def effective_scale_case(case: Case) -> Case:
    """The case with the scale and softcap onnx's reference evaluator really applies (see sqrt_scale_in_dtype):
    judge that implementation's output against this case's reference *and baseline*."""
    from attnconf.reference import numpy_dtype  # noqa: PLC0415

    root = np.sqrt(np.float32(case.scale)) if case.scale is not None else np.sqrt(1.0 / np.sqrt(case.shape["Dk"]))
    with np.errstate(invalid="ignore"):
        r = float(np.asarray(root).astype(numpy_dtype(case.dtype)).astype(np.float64))
    softcap = None if case.softcap is None else float(np.float32(case.softcap))
    return case.replace(scale=r * r, softcap=softcap)


def sqrt_scale_in_dtype(case: Case) -> dict[str, np.ndarray]:
    """The reference with the scale and softcap that onnx's reference evaluator applies: it multiplies Q
    and K each by Cast(Sqrt(scale), T1) (as the operator's function body does), where a given scale is
    the float32 attribute and its square root is taken in float32, and the default 1/sqrt(head_size)
    is taken in float64; the softcap is the float32 attribute. So the effective scale is that square
    root rounded to the input dtype, squared: off by up to 2 ulp of bfloat16 (0.4%) in bfloat16."""
    from attnconf.reference import numpy_dtype  # noqa: PLC0415

    if case.scale is not None:
        root = np.sqrt(np.float32(case.scale))
    else:
        root = np.sqrt(1.0 / np.sqrt(case.shape["Dk"]))
    with np.errstate(invalid="ignore"):
        r = float(np.asarray(root).astype(numpy_dtype(case.dtype)).astype(np.float64))
    softcap = None if case.softcap is None else float(np.float32(case.softcap))
    f = forward(case.q, case.k, case.v, **dict(case_params(case), scale=r * r, softcap=softcap))
    return {"out": f.out, "lse": f.lse}


def function_body_scale(case: Case) -> dict[str, np.ndarray]:
    """The reference with the scale the operator's ONNX function body applies, as onnxruntime runs it for
    float64 (it has no float64 kernel and inlines the body): Q and K are each multiplied by
    Cast(Sqrt(scale), T1) where scale, or 1/sqrt(head_size) when none is given, and its square root
    are float32; the softcap is the float32 attribute. The effective scale is that root squared."""
    from attnconf.reference import numpy_dtype  # noqa: PLC0415

    s32 = np.float32(case.scale) if case.scale is not None else np.float32(1.0) / np.sqrt(np.float32(case.shape["Dk"]))
    with np.errstate(invalid="ignore"):
        r = float(np.sqrt(s32).astype(numpy_dtype(case.dtype)).astype(np.float64))
    softcap = None if case.softcap is None else float(np.float32(case.softcap))
    f = forward(case.q, case.k, case.v, **dict(case_params(case), scale=r * r, softcap=softcap))
    return {"out": f.out, "lse": f.lse}


def ort_f16_additive_sentinel(case: Case) -> dict[str, np.ndarray]:
    """What onnxruntime's float16 Attention computes when it masks by addition: at a position hidden by the
    mask, a -inf bias, the causal frontier or the window the logit is float16(float32(s q.k) - 65504)
    (+inf when that overflows, which turns the row NaN); a key past nonpad_kv_seqlen gets -65504
    itself; visible logits are the reference's. Softmax in float64 over every key of the row."""
    from attnconf.conformance.regions_onnx import _hidden_added, _ort_f16_masked_logits  # noqa: PLC0415
    from attnconf.reference import expand_kv  # noqa: PLC0415

    f = oracle(case)
    e = _ort_f16_masked_logits(case)
    if e is None:
        return {"out": f.out, "lse": f.lse}
    added = _hidden_added(case)
    with np.errstate(all="ignore"):
        lg = np.where(f.visible, f.logits, np.where(added, e, -65504.0))
        m = lg.max(axis=-1, keepdims=True)
        p = np.exp(lg - m)
        l = p.sum(axis=-1, keepdims=True)
        w = p / l
        out = np.einsum("bhij,bhjd->bhid", w, expand_kv(case.v, case.shape["Hq"]))
        lse = (m + np.log(l))[..., 0]
    empty = ~f.visible.any(axis=-1)
    out = np.where(empty[..., None] & ~np.isnan(out), f.out, out)   # rows with no visible key: onnxruntime's 0
    return {"out": out, "lse": lse}


ALTERNATIVES = {"ort_f16_additive_sentinel": ort_f16_additive_sentinel,
                "causal_lifted_last_row": causal_lifted_last_row,
                "causal_frontier_of_first_row": causal_frontier_of_first_row,
                "sqrt_scale_in_dtype": sqrt_scale_in_dtype,
                "function_body_scale": function_body_scale}
