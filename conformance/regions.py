"""Named input regions: the predicates that divergence entries refer to.

A divergence covers a region of the input space, not a list of test ids, so
that inside a Hypothesis test a generated case in the region is recorded as
DIVERGENT(id) and everything outside stays strict. Each predicate takes a
`Case` and returns bool; register it with @region.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from attnconf.reference import Case, oracle

REGIONS: dict[str, Callable[[Case], bool]] = {}


def region(fn: Callable[[Case], bool]) -> Callable[[Case], bool]:
    REGIONS[fn.__name__] = fn
    return fn


@region
def any(case: Case) -> bool:  # noqa: A001 (the region is called "any" in divergence files)
    return True


@region
def fully_masked_rows(case: Case) -> bool:
    """Some query row sees no key (mask, -inf bias, causal, padding). Also for layer cases."""
    if hasattr(case, "num_heads"):  # reference.layer.LayerCase
        return case.mask is not None and bool((~case.mask.any(axis=-1)).any())
    vis = oracle(case).visible
    return bool(vis.shape[-1] == 0 or (~vis.any(axis=-1)).any())


@region
def padded_query_rows(case: Case) -> bool:
    return case.q_lengths is not None and bool((case.q_lengths < case.shape["Lq"]).any())


@region
def dtype_float64(case: Case) -> bool:
    return case.dtype == "float64"


@region
def causal_bottom_right(case: Case) -> bool:
    return case.causal == "bottom_right"


@region
def mask_with_causal(case: Case) -> bool:
    return case.causal is not None and (case.mask is not None or case.bias is not None)


@region
def kv_length_mismatch(case: Case) -> bool:
    """K and V disagree in length (an invalid case, ATTN-OP-6)."""
    return case.k.shape[2] != case.v.shape[2]


@region
def rank1_mask(case: Case) -> bool:
    """A boolean mask of shape (Lk,), broadcast over batch, heads and queries."""
    return case.mask is not None and case.mask.ndim == 1


@region
def masked_logit_beats_finite_mask_bias(case: Case) -> bool:
    """A hidden key's logit exceeds its row's largest visible logit by more than 32768 - 40: a kernel
    that applies a boolean mask as a finite bias of about -32768 (float16's usual choice) lets it through."""
    f = oracle(case)
    hidden = ~f.visible & np.isfinite(f.logits)
    if not hidden.any():
        return False
    top_visible = np.where(f.visible, f.logits, -np.inf).max(axis=-1, keepdims=True)
    return bool((hidden & (f.logits - 32768.0 > top_visible - 40.0)).any())


@region
def negative_scale_is_causal(case: Case) -> bool:
    """A negative custom scale with top-left causal masking alone (what reaches SDPA as is_causal=True)."""
    return (case.scale is not None and case.scale < 0 and case.causal == "top_left" and case.mask is None
            and case.bias is None and case.q_lengths is None and case.kv_lengths is None)


@region
def single_query_single_key(case: Case) -> bool:
    """Lq = Lk = 1: the products degenerate to elementwise ones."""
    return case.shape["Lq"] == 1 and case.shape["Lk"] == 1


@region
def neg_inf_bias(case: Case) -> bool:
    return case.bias is not None and bool(np.isneginf(case.bias).any())


# ---- appended for the tensorflow backend (adapters/tensorflow.py) ----------
@region
def multi_query(case: Case) -> bool:
    """One KV head shared by several query heads (MQA, ATTN-GQA-2)."""
    s = case.shape
    return s["Hkv"] == 1 and s["Hq"] > 1


@region
def float64_scale_not_float32(case: Case) -> bool:
    """float64 case whose effective scale is not exactly a float32 (an API that rounds the scale to float32 loses it)."""
    s = 1.0 / np.sqrt(case.head_dim) if hasattr(case, "num_heads") else case.effective_scale  # layer: 1/sqrt(d)
    return case.dtype == "float64" and float(np.float32(s)) != s


@region
def float16_unscaled_logit_overflow(case: Case) -> bool:
    """float16 case where some unscaled logit |q.k| exceeds float16's max (65504): scaling after the matmul
    overflows. Hidden positions count too: an inf there meets a -inf bias as NaN (measured, seed 10)."""
    if case.dtype != "float16":
        return False
    from attnconf.reference import expand_kv  # noqa: PLC0415

    with np.errstate(all="ignore"):
        raw = np.abs(np.einsum("bhid,bhjd->bhij", case.q, expand_kv(case.k, case.shape["Hq"])))
    return bool((raw > 65504.0).any())
