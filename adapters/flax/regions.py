"""Regions for adapters/flax/divergences.toml and equinox.toml (the lead imports this module so that
`@region` registers them; adapters never import conformance).

- `float16_logit_overflow_rows` (rows): float16 rows in which some key that the boolean mask (with
  causal masking and padding folded in) does not hide has a scaled logit |s q.k| beyond float16's
  largest finite value, 65504. flax and equinox scale Q first and compute the logits in float16, so
  such a logit is +-inf: visible, a +inf makes the softmax NaN; hidden by a -inf bias, +inf + (-inf)
  is NaN. Keys hidden by the mask are replaced by finfo.min and cannot poison the row, so they are
  not counted. The threshold is 65504 itself (conservative by half an ulp: float16 rounds values
  below 65520 down to 65504).
- `dtype_half` (case): float16 and bfloat16 cases.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, expand_kv, visibility
from attnconf.spec.vocabulary import HALF_DTYPES

from attnconf.conformance.engine.regions import region

FLOAT16_MAX = 65504.0


class Rows(np.ndarray):
    """A (B, Hq, Lq) bool array of covered rows whose truth value is "some row is covered", so that a
    case-level matcher (`if region(case):`) exempts the case and a row-level one reads the rows."""

    def __bool__(self) -> bool:
        return bool(np.asarray(self).any())


@region
def float16_logit_overflow_rows(case: Case) -> np.ndarray | bool:
    if hasattr(case, "num_heads") or case.dtype != "float16":   # layer cases: not covered
        return False
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    with np.errstate(all="ignore"):
        logits = case.effective_scale * np.einsum("bhid,bhjd->bhij", case.q, expand_kv(case.k, s["Hq"]))
    not_mask_hidden = visibility(full, mask=case.mask, causal=case.causal, q_lengths=case.q_lengths,
                                 kv_lengths=case.kv_lengths)
    # only +inf poisons a row: a logit below -65504 becomes -inf, a weight of 0 (harmless)
    return ((logits > FLOAT16_MAX) & not_mask_hidden).any(axis=-1).view(Rows)


@region
def dtype_half(case: Case) -> bool:
    return case.dtype in HALF_DTYPES
