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
    divided = _judge_against(query_divided_case(case), case, res, {q: m.copy() for q, m in masks.items()})
    if divided.ok:
        return divided
    multiplied = _judge_against(query_divided_case(case, reciprocal=True), case, res, masks)
    return multiplied if multiplied.ok else divided


@alternative("nan_dv_of_empty_rows", GRADIENTS)
def _nan_dv_of_empty_rows(entry, case, res, masks) -> Verdict:
    """Gradients of a float64 case through force_fp32_for_softmax with rows that see no key (their
    weights NaN): dV of the (batch, KV head) is all NaN, dQ of the row is 0, and dK keeps float32
    accuracy (the float32_precision alternative on the covered dK)."""
    g = res.grads or {}
    if "dv" in masks and "dv" in g:
        v = _exact("dv", np.asarray(g["dv"]), masks["dv"], np.isnan, "NaN")
        if not v.ok:
            return v
    if "dq" in masks and "dq" in g:
        v = _exact("dq", np.asarray(g["dq"]), masks["dq"], lambda a: a == 0, "0")
        if not v.ok:
            return v
    if "dk" in masks and "dk" in g:
        return ALTERNATIVES["float32_precision"].check(entry, case, res, {"dk": masks["dk"]})
    return Verdict(True)

