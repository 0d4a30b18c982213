"""One-defect NumPy kernels for the variants: windows, softcap, ALiBi, sinks and the lse conventions.

Each class is the `numpy:reference` adapter (the float64 oracle rounded once to the dtype) with exactly
one stage of the pipeline replaced by a defective one, of the kind found in real kernels and the glue
around them (window bounds off by one or aligned to the wrong corner, a cap in the wrong place, ALiBi's
sign or distance or offset wrong, a sink left out of the lse or given a value, an lse in base 2). They
are `Adapter` subclasses, so `--kernel=tests.kernels.variant_bugs:NAME` runs them as they are with any
backend (`adapters.load`). `correct` is the control: the same pipeline with no defect, which must pass.

`BUGS` maps each name to its class; each class names the clause it should trip (`clause`) and its defect
(the docstring). tests/test_variant_catalogue.py checks that each differs from the reference on a witness
case (so a bug the suite misses is the suite's gap) and that the suite ends NONCONFORMANT on each.
Needs only NumPy (and ml_dtypes for bfloat16).
"""
from __future__ import annotations

import math

import numpy as np

from attnconf.adapters.base import Result
from attnconf.adapters.numpy import ReferenceAdapter
from attnconf.reference import Case, expand_kv, round_to
from attnconf.reference.attention import Forward, case_params, diagonal_offset, visibility
from attnconf.reference.backward import backward_arrays

BUGS: dict[str, type] = {}


def bug(clause: str):
    def register(cls):
        cls.clause = clause
        BUGS[cls.__name__] = cls
        return cls
    return register


def variant_forward(case: Case, **defects) -> Forward:
    """The spec's pipeline with hooks for one defect each (no defect: equal to `reference.forward`).

    logits = s Q K^T -> cap -> + ALiBi -> + bias -> mask (causal, window, padding, bool, -inf) -> softmax with
    the sink in the denominator -> P V; lse = log of the denominator.
    """
    d = defects
    q, k, v = case.q, case.k, case.v
    B, Hq, Lq, Dk = q.shape
    Lk = k.shape[2]
    s = case.effective_scale
    ke, ve = expand_kv(k, Hq), expand_kv(v, Hq)
    qls = [Lq if case.q_lengths is None else int(case.q_lengths[b]) for b in range(B)]
    kls = [Lk if case.kv_lengths is None else int(case.kv_lengths[b]) for b in range(B)]
    with np.errstate(all="ignore"):
        x = np.einsum("bhid,bhjd->bhij", q, ke)
        raw = s * x
        logits = raw
        cap = None if d.get("softcap_ignored") else case.softcap
        # ---- ALiBi bias (ATTN-ALIBI-1) ----
        ali = np.zeros((B, Hq, Lq, Lk))
        if case.alibi_slopes is not None:
            sl = np.asarray(case.alibi_slopes, dtype=np.float64)
            sl = np.broadcast_to(sl.reshape((-1, Hq) if sl.ndim == 2 else (1, Hq)), (B, Hq))
            if d.get("alibi_batch_slopes_ignored"):
                sl = np.broadcast_to(sl[:1], (B, Hq))
            if d.get("alibi_scaled"):
                sl = sl * s
            for b in range(B):
                align = "top_left" if d.get("alibi_top_left") else case.window_align
                off = diagonal_offset(Lq, Lk, align, qls[b], kls[b])
                dist = np.arange(Lq)[:, None] + off - np.arange(Lk)[None, :]
                if d.get("alibi_sign"):
                    ali[b] = sl[b][:, None, None] * np.abs(dist)
                elif d.get("alibi_signed_distance"):
                    ali[b] = -sl[b][:, None, None] * dist
                elif d.get("alibi_row_constant") and case.causal == align:
                    # flash-attention 2's causal form (csrc/flash_attn/src/alibi.h): +m j, equal to the spec's
                    # bias on every visible key up to the row constant m (i + off): same output, shifted lse
                    ali[b] = sl[b][:, None, None] * np.arange(Lk)[None, None, :]
                else:
                    ali[b] = -sl[b][:, None, None] * np.abs(dist)
        bias = 0.0 if case.bias is None else np.broadcast_to(case.bias, (B, Hq, Lq, Lk))
        # ---- the cap (ATTN-CAP-1) ----
        if cap is not None and d.get("softcap_after_bias"):
            logits = cap * np.tanh((raw + ali + bias) / cap)
        elif cap is not None and d.get("softcap_unscaled"):
            logits = s * cap * np.tanh(x / cap) + ali + bias
        elif cap is not None and not d.get("softcap_after_mask"):
            logits = cap * np.tanh(raw / cap) + ali + bias
        else:
            logits = raw + ali + bias
        # ---- visibility ----
        window = None if d.get("window_ignored") else case.window
        vis = visibility((B, Hq, Lq, Lk), mask=case.mask, bias=case.bias, causal=case.causal,
                         q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
        if window is not None:
            left, right = window
            if d.get("window_symmetric") and left >= 0:
                right = left
            for b in range(B):
                align = "top_left" if d.get("window_top_left") else case.window_align
                if d.get("window_ignores_padding"):
                    off = diagonal_offset(Lq, Lk, align)
                else:
                    off = diagonal_offset(Lq, Lk, align, qls[b], kls[b])
                i = np.arange(Lq)[:, None] + off
                j = np.arange(Lk)[None, :]
                w = np.ones((Lq, Lk), dtype=bool)
                if left >= 0:
                    w &= (j > i - left) if d.get("window_left_exclusive") else (j >= i - left)
                if right >= 0:
                    w &= (j < i + right) if d.get("window_right_exclusive") else (j <= i + right)
                vis[b] &= w
        if cap is not None and d.get("softcap_after_mask"):
            # the cap runs on the masked score matrix: -inf becomes -c and every key is "visible"
            logits = cap * np.tanh(np.where(vis, logits, -np.inf) / cap)
            vis = np.ones_like(vis)
        # ---- softmax with the sink ----
        sinks = None if (case.sinks is None or d.get("sink_ignored")) else np.asarray(case.sinks, dtype=np.float64)
        if sinks is not None and d.get("sink_scaled"):
            sinks = sinks * s
        if sinks is not None and d.get("sink_per_kv_head"):
            g = Hq // k.shape[1]
            sinks = sinks[np.arange(Hq) // g] if g > 1 else sinks[::-1].copy()   # h // G indexes a KV head
        masked = np.where(vis, logits, -np.inf)
        m = masked.max(axis=-1, keepdims=True) if Lk else np.full((B, Hq, Lq, 1), -np.inf)
        if sinks is not None:
            m = np.maximum(m, sinks[None, :, None, None])
        m_safe = np.where(np.isneginf(m), 0.0, m)
        p = np.where(vis, np.exp(masked - m_safe), 0.0)
        l_keys = p.sum(axis=-1, keepdims=True)
        p_sink = np.zeros_like(l_keys) if sinks is None else np.exp(sinks[None, :, None, None] - m_safe)
        l = l_keys + p_sink
        w = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
        out = np.einsum("bhij,bhjd->bhid", w, ve)
        if sinks is not None and d.get("sink_as_value_key") and Lk:
            out = out + np.where(l > 0, p_sink / np.where(l > 0, l, 1.0), 0.0) * ve[:, :, :1, :]
        # ---- lse ----
        l_for_lse = l_keys if (d.get("sink_missing_from_lse") and sinks is not None) else l
        lse = np.where(l_for_lse[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l_for_lse > 0, l_for_lse, 1.0))[..., 0],
                       -np.inf)
        empty = ~vis.any(axis=-1)
        if d.get("sink_empty_row_minus_inf"):
            lse = np.where(empty, -np.inf, lse)
        if d.get("lse_base2"):
            lse = lse / math.log(2)
        if d.get("lse_times_ln2"):
            lse = lse * math.log(2)
        if d.get("lse_empty_plus_inf"):
            lse = np.where(np.isneginf(lse), np.inf, lse)
        if d.get("lse_without_max"):
            lse = np.where(np.isfinite(lse), lse - m_safe[..., 0], lse)
    return Forward(out, w, lse, logits, vis)


class VariantKernel(ReferenceAdapter):
    """The reference adapter's contract over `variant_forward` with this class's `defects`."""

    name = "numpy:variant-kernel"
    defects: dict = {}
    clause = ""
    # variant_forward's pipeline predates chunked attention and the 2026 conventions' own inputs
    capabilities = ReferenceAdapter.capabilities - {"chunk_bottom_right", "chunk_top_left", "sparse_indices", "latent"}

    def forward(self, case: Case) -> Forward:
        return variant_forward(case, **self.defects)

    def run(self, case: Case, *, grads: bool = False) -> Result:
        f = self.forward(case)
        w, out = f.weights, f.out
        keep = None
        if case.dropout_p:
            rng = np.random.default_rng(case.seed)
            keep = rng.random(w.shape) >= case.dropout_p
            w = np.where(keep, w / (1.0 - case.dropout_p), 0.0)
            out = np.einsum("bhij,bhjd->bhid", w, expand_kv(case.v, case.shape["Hq"]))
        t = case.dtype
        res = Result(out=round_to(out, t), out_dtype=t, lse=round_to(f.lse, "float32" if t != "float64" else t),
                     weights=round_to(w, t), kernel=f"{type(self).__name__} (variant_bugs)")
        if grads:
            g = self.gradients(case, f, dropout=None if keep is None else (keep, case.dropout_p))
            res.grads = {n: round_to(getattr(g, n), t) for n in ("dq", "dk", "dv")}
            if case.bias is not None:
                res.grads["dbias"] = round_to(g.dbias, t)
            if case.sinks is not None and g.dsinks is not None:
                res.grads["dsinks"] = round_to(g.dsinks, t)
        return res

    def gradients(self, case: Case, f: Forward, dropout: tuple[np.ndarray, float] | None = None):
        """The analytic backward of this kernel's own forward (its P; the cap's derivative if it caps; the
        forward's own keep mask under dropout)."""
        params = case_params(case)
        return backward_arrays(case.q, case.k, case.v, case.grad_out, fwd=f, dropout=dropout, **params)


class correct(VariantKernel):
    """No defect: the control, which must end CONFORMANT."""

    defects = {}


def _defect(name: str, clause: str, doc: str, **defects):
    cls = type(name, (VariantKernel,), {"defects": defects or {name: True}, "__doc__": doc, "__module__": __name__})
    globals()[name] = cls                       # importable as tests.kernels.variant_bugs:NAME
    return bug(clause)(cls)


# ---- windows ----------------------------------------------------------------------------
_defect("window_left_exclusive", "ATTN-WIN-1", "Defect: the window's left bound is exclusive (j > i + off - left).")
_defect("window_right_exclusive", "ATTN-WIN-1", "Defect: the window's right bound is exclusive (j < i + off + right).")
_defect("window_symmetric", "ATTN-WIN-1", "Defect: window (w, r) used as (w, w), transformers#39408's mistake.")
_defect("window_top_left", "ATTN-WIN-2", "Defect: the window is aligned top-left whatever the case's alignment.")
_defect("window_ignores_padding", "ATTN-WIN-2",
        "Defect: the bottom-right window offset uses the padded Lk - Lq, not each sequence's kv_len - q_len.")
_defect("window_ignored", "ATTN-WIN-3", "Defect: the window argument is accepted and ignored.")
# ---- softcap ----------------------------------------------------------------------------
_defect("softcap_ignored", "ATTN-CAP-1", "Defect: the softcap argument is accepted and ignored (sglang#33915).")
_defect("softcap_after_bias", "ATTN-CAP-1", "Defect: the cap is applied after ALiBi and the bias are added.")
_defect("softcap_after_mask", "ATTN-CAP-1",
        "Defect: the cap is applied to the masked score matrix, so -inf becomes -c and masked keys get weight.")
_defect("softcap_unscaled", "ATTN-CAP-1", "Defect: the cap is applied to the unscaled logits, then scaled: s c tanh(qk / c).")


@bug("ATTN-CAP-3")
class softcap_no_derivative(VariantKernel):
    """Defect: the backward ignores the cap's derivative 1 - tanh^2 (forward correct)."""

    def gradients(self, case, f, dropout=None):
        params = dict(case_params(case), softcap=None)
        return backward_arrays(case.q, case.k, case.v, case.grad_out, fwd=f, dropout=dropout, **params)


# ---- ALiBi ------------------------------------------------------------------------------
_defect("alibi_sign", "ATTN-ALIBI-1", "Defect: ALiBi adds +m |i + off - j| (the sign flipped).")
_defect("alibi_signed_distance", "ATTN-ALIBI-1", "Defect: ALiBi adds -m (i + off - j), a signed distance.")
_defect("alibi_top_left", "ATTN-ALIBI-1", "Defect: ALiBi distances are measured from the top-left diagonal always.")
_defect("alibi_batch_slopes_ignored", "ATTN-ALIBI-1", "Defect: (B, Hq) slopes are read as batch element 0's for every batch.")
_defect("alibi_scaled", "ATTN-ALIBI-1", "Defect: the ALiBi bias is multiplied by the softmax scale.")
_defect("alibi_row_constant", "ATTN-ALIBI-2",
        "Defect: under causal masking ALiBi is added as +m j (flash-attention 2's causal form): right output, "
        "lse off by m (i + off).")
# ---- sinks ------------------------------------------------------------------------------
_defect("sink_ignored", "ATTN-SINK-1", "Defect: the sinks argument is accepted and ignored.")
_defect("sink_missing_from_lse", "ATTN-SINK-2", "Defect: the sink joins the denominator of P but not the returned lse.")
_defect("sink_as_value_key", "ATTN-SINK-1", "Defect: the sink is counted as a key whose value is V[0].")
_defect("sink_scaled", "ATTN-SINK-1", "Defect: the sink logit is multiplied by the softmax scale.")
_defect("sink_per_kv_head", "ATTN-SINK-1", "Defect: sinks indexed by KV head (or reversed without GQA), not by query head.")
_defect("sink_empty_row_minus_inf", "ATTN-SINK-3", "Defect: rows with no key report lse -inf even with a sink.")
# ---- lse conventions --------------------------------------------------------------------
_defect("lse_base2", "ATTN-LSE-1", "Defect: the lse is in base 2 (FlashInfer's statistic, unconverted).")
_defect("lse_times_ln2", "ATTN-LSE-1", "Defect: the lse is multiplied by ln 2 (pytorch#181645's flex error).")
_defect("lse_empty_plus_inf", "ATTN-LSE-2", "Defect: empty rows report lse +inf (flash-attention's encoding, unconverted).")
_defect("lse_without_max", "ATTN-LSE-1", "Defect: the lse forgets to add back the row maximum: log sum exp(S - max).")
