"""Alternatives (`instead`) for adapters/flax/divergences.toml that the shared vocabulary lacks.

flax linen has no scale argument: it divides the query by sqrt(depth) *in the input dtype*
(`query / jnp.sqrt(depth).astype(dtype)`), and a custom scale reaches it through Q (adapters/
prescaled.py: Q' = Q c with c = s r exact). In bfloat16 that is two roundings the spec's naive
baseline does not make: r = sqrt(Dk) rounded to the dtype (Dk = 96: 9.8125 for 9.798, 0.15 %) and
each Q'/r rounded to the dtype. Under jax.jit XLA may replace the division by the constant r with a
multiplication by its reciprocal, itself rounded to the dtype: measured on this project's CPU, float16 does
(a case with Dk = 8: the kernel's output matches Q' * round(1/r) to 1.2e-7 and misses Q' / r by 0.011) and
bfloat16 does not (witness flax_query_scaled_in_dtype_bf16: 0.048 from Q' / r, 0.287 from the reciprocal).
The nearby problem is therefore Q_alt = round(Q' / r) or round(Q' * round(1/r)), with scale 1, each judged
with its own reference and baseline (alternatives._judge_against); the covered elements must conform to one.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.prescaled import rounded_sqrt
from attnconf.conformance.engine.alternatives import ALTERNATIVES, FORWARD, GRADIENTS, Verdict, _exact, _judge_against, alternative
from attnconf.reference import Case, round_to


def query_divided_case(case: Case, *, reciprocal: bool = False) -> Case:
    """The problem flax solves: Q' / r (or, with `reciprocal`, Q' times the dtype's rounding of 1 / r) rounded
    to the case's dtype, with scale 1."""
    r = rounded_sqrt(case.shape["Dk"], case.dtype)
    c = 1.0 if case.scale is None else case.effective_scale * r
    if reciprocal:
        q = (case.q * c) * float(round_to(np.float64(1.0) / r, case.dtype))
    else:
        q = (case.q * c) / r
    return case.replace(q=round_to(q, case.dtype), scale=1.0)


@alternative("query_divided_in_dtype", FORWARD, numeric=True)
def _query_divided_in_dtype(entry, case, res, masks) -> Verdict:
    """The reference and baseline of `query_divided_case`: the query divided by sqrt(Dk), or multiplied by its
    reciprocal, each rounded to the input dtype, before Q K^T; the covered elements conform to one of the two."""
    divided = _judge_against(query_divided_case(case), case, res, masks)
    if divided.ok:
        return divided
    multiplied = _judge_against(query_divided_case(case, reciprocal=True), case, res, masks)
    return multiplied if multiplied.ok else divided


def _bias_only_hidden(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk): keys that the -inf bias hides and nothing else does (no mask, causal alignment, window
    or padding): flax adds the bias to the logits, so the gradient flows through them there, while jnp.where
    cuts it at every key the boolean mask hides."""
    from attnconf.conformance.engine.regions import mask_hidden_keys

    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    if case.bias is None:
        return np.zeros(full, dtype=bool)
    return np.isneginf(np.broadcast_to(case.bias, full)) & ~mask_hidden_keys(case)


@alternative("nan_dv_of_empty_rows", GRADIENTS)
def _nan_dv_of_empty_rows(entry, case, res, masks) -> Verdict:
    """Gradients of a float64 case through force_fp32_for_softmax with rows that see no key (their
    weights NaN): dV of the (batch, KV head) is all NaN; dQ of the row is 0 where the boolean mask hid every
    key, NaN where the -inf bias alone hid one (`_bias_only_hidden`: the NaN reaches the logits), and so are
    dK of such a key and dBias there; the rest of dK and dBias keeps float32 accuracy (float32_precision)."""
    g = res.grads or {}
    if "dv" in masks and "dv" in g:
        v = _exact("dv", np.asarray(g["dv"]), masks["dv"], np.isnan, "NaN")
        if not v.ok:
            return v
    rows = masks["dq"].any(axis=-1) if "dq" in masks else None
    through = _bias_only_hidden(case) & (rows[..., None] if rows is not None else True)
    if "dq" in masks and "dq" in g:
        nan_rows = np.broadcast_to(through.any(axis=-1)[..., None], masks["dq"].shape)
        for want, test, words in ((nan_rows, np.isnan, "NaN"), (~nan_rows, lambda a: a == 0, "0")):
            v = _exact("dq", np.asarray(g["dq"]), masks["dq"] & want, test, words)
            if not v.ok:
                return v
    rest: dict[str, np.ndarray] = {}
    if "dk" in masks and "dk" in g:
        s = case.shape
        keys = through.any(axis=2).reshape(s["B"], s["Hkv"], s["Hq"] // s["Hkv"], s["Lk"]).any(axis=2)
        nan_keys = np.broadcast_to(keys[..., None], masks["dk"].shape)
        v = _exact("dk", np.asarray(g["dk"]), masks["dk"] & nan_keys, np.isnan, "NaN")
        if not v.ok:
            return v
        rest["dk"] = masks["dk"] & ~nan_keys
    if "dbias" in masks and "dbias" in g:
        from attnconf.reference.backward import reduce_to_shape

        nan_bias = reduce_to_shape(through.astype(np.float64), masks["dbias"].shape) > 0
        v = _exact("dbias", np.asarray(g["dbias"]), masks["dbias"] & nan_bias, np.isnan, "NaN")
        if not v.ok:
            return v
        rest["dbias"] = masks["dbias"] & ~nan_bias
    return ALTERNATIVES["float32_precision"].check(entry, case, res, rest) if rest else Verdict(True)

