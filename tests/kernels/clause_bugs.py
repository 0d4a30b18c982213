"""One-defect NumPy kernels for the normative clauses no other catalogue kernel violated (issue 25).

Same construction as tests/kernels/variant_bugs.py: each class is the `numpy:reference` pipeline with one
stage made defective, an `Adapter` run as `--backend=numpy --kernel=tests.kernels.clause_bugs:NAME`, whose
`clause` names the one clause its defect violates (tests/kernels/by_clause.py gathers them) and whose
docstring names the defect. NumPy rather than torch SDPA: the defects sit in statistics SDPA does not
return (weights, lse, dsinks) or in the whole-Case view (float64 arithmetic, raw shapes), and a NumPy kernel
costs a proof run no torch import. tests/test_clause_catalogue.py checks each against the reference on a
witness case (so a miss is the suite's gap) and, slow, that the suite's tests citing its clause catch it.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.base import Result
from attnconf.reference import Case, attention, expand_kv, round_to
from attnconf.reference.attention import Forward
from attnconf.spec.vocabulary import HALF_DTYPES

from .variant_bugs import VariantKernel

BUGS: dict[str, type] = {}


def bug(clause: str):
    def register(cls):
        cls.clause = clause
        BUGS[cls.__name__] = cls
        return cls
    return register


def _empty(f: Forward) -> np.ndarray:
    """(B, Hq, Lq): rows that see no key."""
    return ~f.visible.any(axis=-1)


# ---- the calling contract ---------------------------------------------------------------------
@bug("ATTN-OP-5")
class output_dtype_float32_for_half(VariantKernel):
    """Defect: float16 and bfloat16 inputs give a float32 output (the accumulator's dtype, never cast back)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        res = super().run(case, grads=grads)
        if case.dtype in HALF_DTYPES:
            res.out_dtype = "float32"
        return res


@bug("ATTN-OP-6")
class uneven_groups_accepted(VariantKernel):
    """Defect: Hq not a multiple of Hkv is not checked; query head h reads KV head h * Hkv // Hq."""

    def run_raw(self, q, k, v, dtype):
        hq, hkv = q.shape[1], k.shape[1]
        if hkv and hq % hkv:
            idx = np.arange(hq) * hkv // hq
            return attention(q, k[:, idx], v[:, idx])
        return super().run_raw(q, k, v, dtype)


@bug("ATTN-GQA-2")
class mqa_broadcasts_head_zero(VariantKernel):
    """Defect: with one KV head, every query head returns query head 0's output (the broadcast is taken on
    the wrong operand)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        if case.shape["Hkv"] == 1 and case.shape["Hq"] > 1:
            return f._replace(out=np.broadcast_to(f.out[:, :1], f.out.shape).copy())
        return f


# ---- masks and causality ----------------------------------------------------------------------
@bug("ATTN-MASK-6")
class bias_dropped_under_causal(VariantKernel):
    """Defect: under causal masking the bias is not added (the causal path takes only the mask)."""

    def forward(self, case: Case) -> Forward:
        if case.causal is not None and case.bias is not None:
            case = case.replace(bias=np.where(np.isneginf(case.bias), -np.inf, 0.0))
        return super().forward(case)


@bug("ATTN-CAUSAL-2")
class hidden_keys_leak_one_ulp(VariantKernel):
    """Defect: keys hidden from a row leak into it with a weight of one unit in the last place of the dtype
    (a masked tile's exp(-big) rounded up instead of to 0): far inside every tolerance, but the row changes
    when what it must not see changes."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        hidden = ~f.visible & f.visible.any(axis=-1, keepdims=True)
        n = np.maximum(hidden.sum(axis=-1, keepdims=True), 1)
        leak = np.einsum("bhij,bhjd->bhid", hidden / n, expand_kv(case.v, case.shape["Hq"]))
        eps = float(np.finfo(np.float64 if case.dtype == "float64" else np.float32).eps)
        return f._replace(out=f.out + eps * leak)


@bug("ATTN-CAUSAL-3")
class bottom_right_empty_rows_see_key0(VariantKernel):
    """Defect: with bottom_right and Lq > Lk the rows that see no key attend to key 0 instead (the row index
    clamped at 0 before the diagonal test)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        s = case.shape
        if case.causal != "bottom_right" or s["Lq"] <= s["Lk"] or s["Lk"] == 0:
            return f
        rows = np.zeros(f.out.shape[:3], dtype=bool)
        rows[:, :, : s["Lq"] - s["Lk"]] = True
        rows &= _empty(f)
        v0 = expand_kv(case.v, s["Hq"])[:, :, :1, :]
        return f._replace(out=np.where(rows[..., None], v0, f.out))


# ---- fully-masked rows, weights, lse ------------------------------------------------------------
@bug("ATTN-EMPTY-2")
class empty_row_uniform_weights(VariantKernel):
    """Defect: a row that sees no key returns uniform weights 1/Lk (its output is still 0)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        lk = max(case.shape["Lk"], 1)
        return f._replace(weights=np.where(_empty(f)[..., None], 1.0 / lk, f.weights))


@bug("ATTN-W-1")
class weights_unnormalised(VariantKernel):
    """Defect: the returned weights are exp(S - max) before the division by the row sum (the output is right)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        with np.errstate(all="ignore"):
            top = f.weights.max(axis=-1, keepdims=True)
            w = np.where(top > 0, f.weights / np.where(top > 0, top, 1.0), 0.0)
        return f._replace(weights=w)


@bug("ATTN-W-2")
class hidden_weights_tiny(VariantKernel):
    """Defect: the returned weight of an invisible key is 1e-30 instead of 0 (the output is right)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        return f._replace(weights=np.where(f.visible, f.weights, 1e-30))


@bug("ATTN-W-3")
class lse_of_the_mean(VariantKernel):
    """Defect: the lse is the log of the mean of exp(S) over the visible keys, not of the sum."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        n = np.maximum(f.visible.sum(axis=-1), 1)
        return f._replace(lse=np.where(np.isfinite(f.lse), f.lse - np.log(n), f.lse))


@bug("ATTN-LSE-3")
class lse_rows_by_heads(VariantKernel):
    """Defect: the lse comes back as (B, Lq, Hq), FlashInfer's row-major layout, unmapped."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        return f._replace(lse=np.ascontiguousarray(np.swapaxes(f.lse, 1, 2)))


# ---- dropout ------------------------------------------------------------------------------------
@bug("ATTN-DROP-1")
class zero_dropout_keeps_255_of_256(VariantKernel):
    """Defect: the keep probability is quantised to 8 bits, so dropout_p = 0 still drops a weight with
    probability 1/256 (and rescales by 256/255), drawn from the call's seed."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if case.dropout_p:
            return super().run(case, grads=grads)
        res = super().run(case, grads=False)
        f = self.forward(case)
        keep = np.random.default_rng(case.seed).random(f.weights.shape) >= 1 / 256
        w = np.where(keep, f.weights * 256 / 255, 0.0)
        res.out = round_to(np.einsum("bhij,bhjd->bhid", w, expand_kv(case.v, case.shape["Hq"])), case.dtype)
        return res


# ---- gradients ----------------------------------------------------------------------------------
@bug("ATTN-EMPTY-3")
class empty_row_dq_is_q(VariantKernel):
    """Defect: a row that sees no key gets dQ = its own q (a stale accumulator) instead of 0."""

    def gradients(self, case, f, dropout=None):
        g = super().gradients(case, f, dropout)
        return g._replace(dq=np.where(_empty(f)[..., None], case.q, g.dq))


@bug("ATTN-GRAD-2")
class dbias_times_scale(VariantKernel):
    """Defect: dBias carries the softmax scale (the bias differentiated as if added before scaling)."""

    def gradients(self, case, f, dropout=None):
        g = super().gradients(case, f, dropout)
        return g if g.dbias is None else g._replace(dbias=g.dbias * case.effective_scale)


@bug("ATTN-SINK-4")
class sink_gradient_sign(VariantKernel):
    """Defect: dsinks has the wrong sign (d lse / d sigma taken as the gradient, not its negative)."""

    def gradients(self, case, f, dropout=None):
        g = super().gradients(case, f, dropout)
        return g if g.dsinks is None else g._replace(dsinks=-g.dsinks)


@bug("ATTN-TOL-5")
class gradients_through_bfloat16(VariantKernel):
    """Defect: dQ, dK and dV are stored in bfloat16 before the cast to the input dtype (float32 cases)."""

    def gradients(self, case, f, dropout=None):
        g = super().gradients(case, f, dropout)
        if case.dtype != "float32":
            return g
        return g._replace(**{n: round_to(getattr(g, n), "bfloat16") for n in ("dq", "dk", "dv")})


# ---- precision and stability ------------------------------------------------------------------
@bug("ATTN-TOL-4")
class float64_through_float32(VariantKernel):
    """Defect: float64 inputs are computed in float32 (the output is float64, its digits are not)."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        return f._replace(out=round_to(f.out, "float32")) if case.dtype == "float64" else f


@bug("ATTN-PROP-13")
class row_max_of_first_block(VariantKernel):
    """Defect: the softmax subtracts the maximum of the first 16 keys only (a row max never updated past the
    first block): exact where logits are small, exp overflows to inf and the row to NaN where a later key's
    logit is far larger."""

    def forward(self, case: Case) -> Forward:
        f = super().forward(case)
        with np.errstate(all="ignore"):
            s = np.where(f.visible, f.logits, -np.inf)
            first = s[..., :16].max(axis=-1, keepdims=True) if s.shape[-1] else s.sum(axis=-1, keepdims=True)
            m = np.where(np.isfinite(first), first, 0.0)
            p = np.where(f.visible, np.exp(np.float32(s - m)), 0.0)          # float32 exp: overflows past 88
            w = p / p.sum(axis=-1, keepdims=True)
            w = np.where(_empty(f)[..., None], 0.0, w)
            out = np.einsum("bhij,bhjd->bhid", w, expand_kv(case.v, case.shape["Hq"]))
        if case.sinks is not None:       # the defect is in the keys' max; sink rows keep the reference
            return f
        return f._replace(out=out, weights=w)


# ---- decode and long sequences ------------------------------------------------------------------
@bug("ATTN-DECODE-1")
class decode_aligned_top_left(VariantKernel):
    """Defect: with Lq = 1 the causal mask, window and ALiBi are aligned top-left, so the one query sees only
    key 0 (a decode path that drops the bottom-right offset)."""

    def forward(self, case: Case) -> Forward:
        if case.shape["Lq"] == 1 and case.shape["Lk"] > 1 and (case.causal or case.window or
                                                              case.alibi_slopes is not None):
            case = case.replace(causal="top_left" if case.causal else None, window_align="top_left")
        return super().forward(case)


@bug("ATTN-LONG-1")
class keys_past_4096_dropped(VariantKernel):
    """Defect: keys at positions >= 4096 are never read (a split-KV launch sized for 4096 keys)."""

    def forward(self, case: Case) -> Forward:
        if case.shape["Lk"] > 4096:
            keep = np.arange(case.shape["Lk"]) < 4096
            mask = keep[None, None, None, :] if case.mask is None else np.logical_and(case.mask, keep)
            case = case.replace(mask=mask)
        return super().forward(case)
