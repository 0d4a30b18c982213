"""Named input regions: which elements of a case a divergence entry covers.

A divergence covers a region of the input space, not a list of test ids, and
inside a case only the elements its region names: a generated case is checked
as usual everywhere else. A region is a function of the `Case` (or `LayerCase`)
that returns either

- a bool: a *case* region, covering every element of the cases it matches, or
- a bool array of query rows, (B, Hq, Lq) for attention and (B, Lq) for a layer:
  a *row* region, covering those rows' outputs and lse, their dQ and dBias, and
  the dK/dV rows of the keys they could reach.

Register with @region; divergence files name regions by function name.
Backend-specific regions live in the backend's pack (`adapters/<backend>/regions.py`,
attnconf.adapters.pack); `load_all()` imports those of every registered backend.
"""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from attnconf.reference import Case, expand_kv, oracle

RegionResult = bool | np.ndarray
REGIONS: dict[str, Callable[[Case], RegionResult]] = {}
CASE_REGIONS: set[str] = set()


def region(fn: Callable[[Case], RegionResult]) -> Callable[[Case], RegionResult]:
    REGIONS[fn.__name__] = fn
    return fn


def case_region(fn: Callable[[Case], bool]) -> Callable[[Case], bool]:
    """A region that covers whole cases (its function returns a bool)."""
    CASE_REGIONS.add(fn.__name__)
    return region(fn)


def is_layer(case) -> bool:
    return hasattr(case, "num_heads")


def _layer_empty_rows(case) -> np.ndarray:
    """(B, Lq) rows of a layer case whose mask (and causal alignment) hide every key."""
    B, Lq, Lk = case.x_q.shape[0], case.x_q.shape[1], case.x_k.shape[1]
    vis = np.ones((B, Lq, Lk), dtype=bool) if case.mask is None else np.broadcast_to(case.mask, (B, Lq, Lk))
    if case.causal == "top_left":
        vis = vis & (np.arange(Lk)[None, :] <= np.arange(Lq)[:, None])
    return ~vis.any(axis=-1)


# ---- row regions -----------------------------------------------------------------

@region
def fully_masked_rows(case) -> np.ndarray:
    """Rows that see no key, whatever hid them (mask, -inf bias, causal, window, padding)."""
    if is_layer(case):
        return _layer_empty_rows(case)
    return ~oracle(case).visible.any(axis=-1)


@region
def rows_seeing_a_key(case) -> np.ndarray:
    """Rows that see at least one key: every row whose output is a weighted sum of values (the
    complement of fully_masked_rows). Their gradients reach dQ of the row and dK/dV of its keys."""
    return ~fully_masked_rows(case)


def mask_hidden_keys(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk): keys hidden by something other than the bias (the boolean mask, causal
    alignment, a window, padding). An API that applies those as a large finite negative logit gives
    a row that sees no key uniform weights over exactly these keys; keys hidden by -inf bias alone
    keep weight 0."""
    from attnconf.reference import visibility

    s = case.shape
    return ~visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                       q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                       window_align=case.window_align, chunk=case.chunk)


@region
def mask_emptied_rows(case) -> np.ndarray:
    """Empty rows in which some key is hidden by the boolean mask, causal alignment, a window or
    padding (not only by -inf bias)."""
    if is_layer(case):
        return _layer_empty_rows(case)
    return fully_masked_rows(case) & mask_hidden_keys(case).any(axis=-1)


@region
def mask_emptied_rows_within_q_lengths(case) -> np.ndarray:
    """mask_emptied_rows that are not padded query rows (i < q_lengths[b]): for an API that zeroes
    the rows beyond a query length but fills other empty rows with a finite mask value."""
    rows = mask_emptied_rows(case)
    if is_layer(case):
        return rows
    return rows & ~padded_query_rows(case)


@region
def bias_emptied_rows(case) -> np.ndarray:
    """Empty rows in which no key is hidden by anything but -inf bias (or there is no key at all)."""
    if is_layer(case):
        return np.zeros(case.x_q.shape[:2], dtype=bool)
    return fully_masked_rows(case) & ~mask_hidden_keys(case).any(axis=-1)


@region
def padded_query_rows(case) -> np.ndarray:
    """Rows i >= q_lengths[b]."""
    s = case.shape
    rows = np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    if case.q_lengths is not None:
        for b, n in enumerate(case.q_lengths):
            rows[b, :, int(n):] = True
    return rows


@region
def overflowing_logit_rows(case) -> np.ndarray:
    """float16 rows where some unscaled q.k exceeds float16's max (65504), at a visible or a
    hidden key: computing Q K^T in float16 before scaling gives +inf there, which no finite or
    -inf addend removes. (A dot product below -65504 becomes -inf: a weight of 0, harmless.)"""
    return (_raw_logits_f16(case) > 65504.0).any(axis=-1)


def _raw_logits_f16(case) -> np.ndarray:
    """The unscaled q.k of a float16 case (B, Hq, Lq, Lk), -inf everywhere for other dtypes."""
    s = case.shape
    if case.dtype != "float16":
        return np.full((s["B"], s["Hq"], s["Lq"], s["Lk"]), -np.inf)
    with np.errstate(all="ignore"):
        return np.einsum("bhid,bhjd->bhij", case.q, expand_kv(case.k, s["Hq"]))


@region
def overflowing_logit_rows_outside_mask(case) -> np.ndarray:
    """float16 rows where some unscaled q.k exceeds float16's max at a key the boolean mask (or
    causal alignment, padding) does not hide: an API that replaces masked logits with a finite
    negative (tf.where) discards the +inf there, but not at a visible or a bias-hidden key."""
    return ((_raw_logits_f16(case) > 65504.0) & ~mask_hidden_keys(case)).any(axis=-1)


@region
def half_dot_overflow_rows_outside_mask(case) -> np.ndarray:
    """float16 rows with a key the boolean mask (causal alignment, padding) does not hide where
    sum_d |q_d k_d| exceeds float16's max: a dot product accumulated in float16 can pass +-65504 in a
    product or a partial sum there, in some summation order, even when the whole q.k does not."""
    s = case.shape
    if case.dtype != "float16":
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    with np.errstate(all="ignore"):
        reach = np.einsum("bhid,bhjd->bhij", np.abs(case.q), np.abs(expand_kv(case.k, s["Hq"])))
    return ((reach > 65504.0) & ~mask_hidden_keys(case)).any(axis=-1)


@region
def half_dot_negative_overflow_rows(case) -> np.ndarray:
    """float16 rows with a key the boolean mask (causal alignment, padding) hides, where every other key
    has a -inf bias or a negative reach (the sum of q_d k_d over its negative products) beyond -65504:
    in a float16 dot product each of those logits can become -inf, in some summation order, and an API
    that gives masked keys a finite fill then weighs the masked keys instead."""
    s = case.shape
    rows = np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    if case.dtype != "float16":
        return rows
    hidden = mask_hidden_keys(case)
    if not hidden.any():
        return rows
    k = expand_kv(case.k, s["Hq"])
    with np.errstate(all="ignore"):     # a product is negative where the signs differ: q+ k- + q- k+
        qp, qn = np.maximum(case.q, 0.0), np.minimum(case.q, 0.0)
        kp, kn = np.maximum(k, 0.0), np.minimum(k, 0.0)
        negative = np.einsum("bhid,bhjd->bhij", qp, kn) + np.einsum("bhid,bhjd->bhij", qn, kp)
        sinks = negative < -65504.0
    if case.bias is not None:
        sinks |= np.broadcast_to(np.isneginf(case.bias), sinks.shape)
    return hidden.any(axis=-1) & (sinks | hidden).all(axis=-1)


@region
def lse_beyond_float16_rows(case) -> np.ndarray:
    """float16 rows whose reference |lse| exceeds float16's max (65504): an lse returned in the
    input dtype cannot hold it."""
    s = case.shape
    if case.dtype != "float16":
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.isfinite(oracle(case).lse) & (np.abs(oracle(case).lse) > 65504.0)


@region
def softcap_beyond_float16_rows(case) -> np.ndarray:
    """Rows that see a key, in float16 cases whose softcap rounds to +inf in float16 (c >= 65520)."""
    s = case.shape
    if case.dtype != "float16" or case.softcap is None or float(case.softcap) < 65520.0:
        return np.zeros((s["B"], s["Hq"], s["Lq"]), dtype=bool)
    return oracle(case).visible.any(axis=-1)


@region
def large_logit_rows(case) -> np.ndarray:
    """Rows whose largest visible |logit| is at least 1000, where one float32 rounding of a logit
    (ulp >= 6e-5) moves its weight by that much relative: kernels that form exp2(s log2 e) or rescale
    online round the logits more often than the naive baseline does."""
    f = oracle(case)
    with np.errstate(invalid="ignore"):
        return (np.where(f.visible, np.abs(f.logits), 0.0) >= 1000.0).any(axis=-1)


@region
def masked_logit_beats_finite_mask_bias(case) -> np.ndarray:
    """Rows where a hidden key's logit exceeds the row's largest visible logit by more than
    32768 - 40: a kernel that applies a boolean mask as a finite bias of about -32768 (float16's
    usual choice) lets that key through."""
    f = oracle(case)
    hidden = ~f.visible & np.isfinite(f.logits)
    top_visible = np.where(f.visible, f.logits, -np.inf).max(axis=-1, keepdims=True, initial=-np.inf)
    return (hidden & (f.logits - 32768.0 > top_visible - 40.0)).any(axis=-1)


@region
def bool_mask_emptied_rows(case) -> np.ndarray:
    """mask_emptied_rows of cases without a bias: an SDPA-convention call then passes the mask, padding
    and causal alignment as one boolean attn_mask (with a bias it passes a float mask holding -inf)."""
    rows = mask_emptied_rows(case)
    return rows if case.bias is None else np.zeros_like(rows)


@region
def bool_masked_logit_beats_finite_mask_bias(case) -> np.ndarray:
    """masked_logit_beats_finite_mask_bias of cases without a bias (see bool_mask_emptied_rows)."""
    rows = masked_logit_beats_finite_mask_bias(case)
    return rows if case.bias is None else np.zeros_like(rows)


@region
def zero_scale_rows(case) -> bool | np.ndarray:
    """Every row of a case with a custom scale of exactly 0 (every logit 0: uniform weights)."""
    return _every_row(case) if case.scale is not None and case.scale == 0 else False


@region
def nonpositive_scale_rows(case) -> bool | np.ndarray:
    """Every row of a case with a custom scale <= 0."""
    return _every_row(case) if case.scale is not None and case.scale <= 0 else False


def _every_row(case) -> np.ndarray:
    s = case.shape
    return np.ones((s["B"], s["Hq"], s["Lq"]), dtype=bool)


# ---- case regions ----------------------------------------------------------------

@case_region
def any(case) -> bool:  # noqa: A001 (the region is called "any" in divergence files)
    return True


@case_region
def dtype_float64(case) -> bool:
    return case.dtype == "float64"


@case_region
def float64_scale_not_float32(case) -> bool:
    """float64 case whose effective scale is not exactly a float32 (an API that rounds the scale
    to float32 loses it). A layer's scale is 1/sqrt(head_dim)."""
    s = 1.0 / np.sqrt(case.head_dim) if is_layer(case) else case.effective_scale
    return case.dtype == "float64" and float(np.float32(s)) != s


@case_region
def kv_length_mismatch(case) -> bool:
    """K and V disagree in length (an invalid call, ATTN-OP-6)."""
    return case.k.shape[2] != case.v.shape[2]


@case_region
def rank1_mask(case) -> bool:
    """A boolean mask of shape (Lk,), broadcast over batch, heads and queries."""
    return case.mask is not None and case.mask.ndim == 1


@region
def nonpositive_scale_is_causal(case) -> bool | np.ndarray:
    """With a custom scale <= 0 and top-left causal masking alone (what reaches SDPA as is_causal=True),
    the rows that causal masking hides some key from (a kernel that fills the mask's -inf before scaling
    turns it into +inf or NaN there; rows that see every key are unaffected)."""
    if not (case.scale is not None and case.scale <= 0 and case.causal == "top_left" and case.mask is None
            and case.bias is None and case.q_lengths is None and case.kv_lengths is None):
        return False
    return ~oracle(case).visible.all(axis=-1)


@case_region
def degenerate_products(case) -> bool:
    """B = Hkv = 1 and two of the three extents of Q K^T (G Lq, Dk, Lk) or of P V (G Lq, Lk, Dv) are 1,
    with G = Hq / Hkv query heads per KV head: a product that is one vector dot product, or a vector
    times a scalar."""
    s = case.shape
    if s["B"] != 1 or s["Hkv"] != 1:
        return False
    m = s["Lq"] * (s["Hq"] // s["Hkv"])
    return max(sum(n == 1 for n in dims) for dims in ((m, s["Dk"], s["Lk"]), (m, s["Lk"], s["Dv"]))) >= 2


@case_region
def multi_query(case) -> bool:
    """One KV head shared by several query heads (MQA, ATTN-GQA-2)."""
    s = case.shape
    return s["Hkv"] == 1 and s["Hq"] > 1


# ---- what a region covers ------------------------------------------------------------

def rows_of(name: str, case) -> np.ndarray | None:
    """The covered rows of `case` for region `name`: a bool row array, or None for "the whole case"
    (a case region that matches). An empty array means the region does not touch the case."""
    try:
        got = REGIONS[name](case)
    except Exception:  # a predicate that cannot judge this case (e.g. invalid shapes) does not cover it
        got = False
    if isinstance(got, (bool, np.bool_)):
        return None if got else np.zeros(0, dtype=bool)
    return np.asarray(got, dtype=bool)


def touches(rows: np.ndarray | None) -> bool:
    return rows is None or bool(rows.any())


def load_all() -> None:
    """Import every registered backend pack's `regions` module (their @region functions register)."""
    from attnconf.adapters.registry import pack_modules

    for name in pack_modules("regions"):
        importlib.import_module(name)
