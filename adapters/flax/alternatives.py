"""Alternatives (`instead`) for adapters/flax/divergences.toml that the shared vocabulary lacks.

flax linen has no scale argument: it divides the query by sqrt(depth) *in the input dtype*
(`query / jnp.sqrt(depth).astype(dtype)`), and a custom scale reaches it through Q (adapters/
prescaled.py: Q' = Q c with c = s r exact). In bfloat16 that is two roundings the spec's naive
baseline does not make: r = sqrt(Dk) rounded to the dtype (Dk = 96: 9.8125 for 9.798, 0.15 %) and
each Q'/r rounded to the dtype. The nearby problem is therefore Q_alt = round(Q' / r) with scale 1,
judged with its own reference and baseline (alternatives._judge_against).
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.prescaled import rounded_sqrt
from attnconf.conformance.engine.alternatives import ALTERNATIVES, FORWARD, GRADIENTS, Verdict, _exact, _judge_against, alternative
from attnconf.reference import Case, round_to


def query_divided_case(case: Case) -> Case:
    """The problem flax solves: Q' / r rounded to the case's dtype, with scale 1."""
    r = rounded_sqrt(case.shape["Dk"], case.dtype)
    c = 1.0 if case.scale is None else case.effective_scale * r
    return case.replace(q=round_to((case.q * c) / r, case.dtype), scale=1.0)


@alternative("query_divided_in_dtype", FORWARD, numeric=True)
def _query_divided_in_dtype(entry, case, res, masks) -> Verdict:
    """The reference and baseline of `query_divided_case`: the query divided by sqrt(Dk), both
    rounded to the input dtype, before Q K^T."""
    return _judge_against(query_divided_case(case), case, res, masks)


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

