"""Alternatives (`instead`) for adapters/onnx/divergences.toml that the shared vocabulary lacks.

Registered with `conformance.alternatives.alternative`, like the shared ones: each judges the covered
elements of a result and returns a Verdict. adapters/onnx/regions.py imports this module, so
`regions.load_all()` registers them. Where the behaviour is "the reference of a nearby problem" the
nearby Case is built here and judged with its own reference and baseline (`alternatives._judge_against`);
the functions `*_case` and `*_expected` are exposed for tests and reports.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives import FORWARD, Verdict, _exact, _judge_against, _judged, alternative
from attnconf.reference import Case, expand_kv, numpy_dtype, oracle
from attnconf.spec.vocabulary import HALF_DTYPES


# ---- the contrib operators: scale 0 is the default's sentinel ----------------------------------------

@alternative("default_scale", FORWARD)
def _default_scale(entry, case, res, masks) -> Verdict:
    """The reference of the same case with the default scale 1/sqrt(Dk) in place of the given one."""
    return _judge_against(case.replace(scale=None), case, res, masks)


def contrib_scale_case(case: Case) -> Case:
    """The case with the scale the contrib operators apply: the default 1/sqrt(Dk) where the case gives 0
    (ONNX-ORT-CONTRIB-ZERO-SCALE-DEFAULT), so that their other entries' alternatives compose with that one."""
    return case.replace(scale=None) if getattr(case, "scale", None) == 0 else case


# ---- MultiHeadAttention: the last row skipped by the causal loop ---------------------------------

def causal_lifted_case(case: Case) -> Case:
    """The case without its causal mask, at MultiHeadAttention's scale (contrib_scale_case): what it computes
    on the rows it forgets to mask."""
    return contrib_scale_case(case).replace(causal=None)


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
    q_sequence_length from the mask's shape, so every query row gets row 0's causal frontier. Judged as
    that evaluator computes everything else (its effective scale; half precision as in
    evaluator_half_precision; float16 rows whose hidden logits overflow are NaN, as in
    ref_f16_hidden_logit_overflow)."""
    alt = first_row_frontier_case(case)
    if case.dtype == "float16" and "out" in masks:
        from attnconf.adapters.onnx.regions import ref_f16_overflow_rows  # noqa: PLC0415

        nan_rows = ref_f16_overflow_rows(case, oracle(alt).visible)     # its float16 overflow, on its own frontier
        if nan_rows.any():
            cover = masks["out"] & nan_rows[..., None]
            v = _exact("out", np.asarray(res.out), cover, np.isnan, "NaN")
            if not v.ok:
                return v
            masks = dict(masks, out=masks["out"] & ~nan_rows[..., None])
            masks.pop("lse", None)
    return _judge_evaluator(effective_scale_case(alt), case, res, masks)


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


@alternative("sqrt_scale_in_dtype", FORWARD + ("weights",), numeric=True)
def _sqrt_scale_in_dtype(entry, case, res, masks) -> Verdict:
    """The spec's tolerance model for the problem with the effective scale (effective_scale_case): its
    reference and its baseline (the baseline's sqrt(scale)-on-Q-and-K variant is then the evaluator's
    arithmetic)."""
    return _judge_against(effective_scale_case(case), case, res, masks)


@alternative("function_body_scale", FORWARD, numeric=True)
def _function_body_scale(entry, case, res, masks) -> Verdict:
    """The spec's tolerance model for the problem with the function body's scale (function_body_scale_case)."""
    return _judge_against(function_body_scale_case(case), case, res, masks)


# ---- onnx's reference evaluator in float16 / bfloat16 ----------------------------------------------

def naive_half_softmax(case: Case) -> np.ndarray:
    """The output of a naive implementation that runs the softmax in the case's half dtype: logits as the
    baseline's sqrt(scale)-on-Q-and-K variant (Q and K each multiplied by sqrt(scale) and rounded, the
    product accumulated in float32 and rounded), then the row maximum subtracted, exp, a row sum
    accumulated sequentially and a division, each rounded to the dtype; P V accumulated in float32 and
    rounded. It states what "softmax in the input precision" (the Attention schema's default
    softmax_precision) costs, as naive_forward_half_accumulation does for dot products."""
    from attnconf.reference.emulate import _rounder, seq_matmul  # noqa: PLC0415

    r = _rounder(case.dtype)
    s = case.shape
    f = oracle(case)
    root = np.sqrt(case.effective_scale)
    with np.errstate(all="ignore"):
        qs = r(case.q * root)
        ks = r(expand_kv(case.k, s["Hq"]) * root)
        lg = r(seq_matmul(qs, np.swapaxes(ks, -1, -2), "ascending"))
        if case.softcap is not None:
            c = np.float32(case.softcap)
            lg = r(c * np.tanh(lg / c))
        if case.bias is not None:
            lg = r(lg + np.where(np.isneginf(case.bias), 0.0, case.bias).astype(np.float32))
        lg = np.where(f.visible, lg, -np.inf).astype(np.float32)
        m = lg.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0).astype(np.float32)
        e = np.where(f.visible, r(np.exp(r(lg - m))), 0).astype(np.float32)
        den = np.zeros(e.shape[:-1] + (1,), np.float32)
        for j in range(e.shape[-1]):
            den = r(den + e[..., j:j + 1])
        w = r(np.where(den > 0, e / np.where(den > 0, den, 1), 0))
        out = r(seq_matmul(w, expand_kv(case.v, s["Hq"]), "ascending"))
    return out.astype(np.float64)


def _judge_evaluator(alt: Case, case: Case, res, masks) -> Verdict:
    """Judge against the nearby problem `alt`; in float16 / bfloat16 with the larger of the spec's baseline
    error and that of naive_half_softmax (the evaluator's softmax runs in the input dtype)."""
    from attnconf.reference import baseline_error  # noqa: PLC0415

    if case.dtype not in HALF_DTYPES or "out" not in masks:
        return _judge_against(alt, case, res, masks)
    ref = oracle(alt).out
    with np.errstate(invalid="ignore"):
        base = np.maximum(np.nan_to_num(np.abs(naive_half_softmax(alt) - ref), nan=0.0, posinf=0.0),
                       baseline_error(alt)[0])
    return _judged(T.judge_arrays(np.asarray(res.out), ref, base, case.dtype, quantity="out (half softmax)",
                                  mask=masks["out"]))


@alternative("evaluator_half_precision", FORWARD, numeric=True)
def _evaluator_half_precision(entry, case, res, masks) -> Verdict:
    """onnx's reference evaluator in float16 / bfloat16: the reference of the effective-scale problem
    (effective_scale_case), within c_max x the error of a naive implementation whose softmax runs in the
    dtype (naive_half_softmax) or the spec's baseline, whichever is larger, plus the floor."""
    return _judge_evaluator(effective_scale_case(case), case, res, masks)


# ---- MultiHeadAttention: rows emptied where the causal sentinel is finite ---------------------------

def mha_sentinel_survivors(case: Case, keys: np.ndarray) -> np.ndarray:
    """(B, Hq, Lq, Lk) the keys among `keys` (hidden by MultiHeadAttention's causal frontier alone) that
    take the weight of a row that sees no key: its kernel adds the scaled logit to the sentinel lowest()
    in float32 (the mask preloaded into the GEMM's C with beta = 1), and lowest()'s spacing is 2^104, so
    a logit below about 1e31 is absorbed (every such key scores lowest(): equal weight) while a larger one
    moves its key by a spacing or more, and the row's softmax then weighs only the keys at the row's
    highest score. A logit below about -1e31 sends its score past lowest() to -inf; a row whose keys all go
    there has no survivor and is NaN (measured)."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        logit = f32(contrib_scale_case(case).effective_scale) * np.einsum("bhid,bhjd->bhij", case.q.astype(f32),
                                                      expand_kv(case.k, case.shape["Hq"]).astype(f32))
        score = np.where(keys, np.finfo(f32).min + logit, -np.inf)
    top = score.max(axis=-1, keepdims=True)
    return keys & (score == top) & np.isfinite(top)


@alternative("mean_of_causal_hidden_values", FORWARD)
def _mean_of_causal_hidden_values(entry, case, res, masks) -> Verdict:
    """Each covered row is the mean of V over the keys hidden by MultiHeadAttention's causal frontier alone
    (_mha_causal_only_keys: its finite sentinel, assigned over key padding, absorbs the logits, so those keys
    get equal weight), or over those of them whose logits are too large to be absorbed and score highest
    (mha_sentinel_survivors)."""
    from attnconf.adapters.onnx.regions import _mha_causal_only_keys  # noqa: PLC0415
    from attnconf.reference.emulate import _rounder, seq_matmul  # noqa: PLC0415

    if "out" not in masks:
        return Verdict(True)
    rows = masks["out"].any(axis=-1)
    keys = _mha_causal_only_keys(case)
    keys = np.zeros(oracle(case).visible.shape, bool) if keys is None else keys & rows[..., None]
    keys = mha_sentinel_survivors(case, keys)
    nan_rows = masks["out"] & ~keys.any(axis=-1, keepdims=True)
    verdict = _exact("out", np.asarray(res.out), nan_rows, np.isnan, "NaN")
    if not verdict.ok or not (masks["out"] & ~nan_rows).any():
        return verdict
    masks = dict(masks, out=masks["out"] & ~nan_rows)
    w = np.where(keys, 1.0 / np.maximum(keys.sum(axis=-1, keepdims=True), 1), 0.0)
    v = expand_kv(case.v, case.shape["Hq"])
    expected = np.einsum("bhij,bhjd->bhid", w, v)
    r = _rounder(case.dtype)
    naive = r(seq_matmul(r(w.astype(np.float32)), v.astype(np.float32), "ascending")).astype(np.float64)
    vmax = np.where(rows[..., None], np.abs(v).max(axis=-2, keepdims=True), 0.0)
    return _judged(T.judge_arrays(np.asarray(res.out), expected, np.abs(naive - expected), case.dtype,
                                  quantity="out (mean of causally hidden values)", magnitude=vmax,
                                  mask=masks["out"]))


# ---- onnxruntime's float16 Attention: the additive sentinel -----------------------------------------

def ort_f16_sentinel_expected(case: Case) -> dict[str, np.ndarray]:
    """What onnxruntime's float16 Attention computes when it masks by addition: the softmax, in float64, of
    the float16 scores it holds (regions._ort_f16_scores): at a position hidden by the mask, a -inf
    bias, the causal frontier or the window float16(float32(s q.k) - 65504) (+inf when that overflows,
    which turns the row NaN); at a key past nonpad_kv_seqlen -65504 itself; at a visible key the logit
    rounded to float16 (-inf below -65504, so that masked keys can outweigh it)."""
    from attnconf.adapters.onnx.regions import _ort_f16_scores  # noqa: PLC0415

    f = oracle(case)
    lg = _ort_f16_scores(case)
    if lg is None:
        return {"out": f.out, "lse": f.lse}
    with np.errstate(all="ignore"):
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
