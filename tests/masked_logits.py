"""An independent NumPy derivation of what `flax.linen.dot_product_attention` and equinox compute on
fully-masked rows: an alternative for adapters/flax/divergences.toml (`instead = "masked_logits_constant"`).

Both replace a masked logit by a constant, `jnp.finfo(dtype).min`, *after* the bias is added
(flax/linen/attention.py `dot_product_attention_weights`: `jnp.where(mask, attn_weights, big_neg)`;
equinox/nn/_attention.py `dot_product_attention_weights`: `jnp.where(mask, logits, finfo.min)`),
and then take an ordinary softmax. The constant is below every finite logit of a row that sees a
key, so such rows are exactly the reference. On a fully-masked row it decides everything:

- if some key of the row is hidden by the boolean mask (with causal masking and padding folded
  into it, as the adapters do), every such key has the same logit, whatever its bias: the row's
  weights are uniform over those keys, and its output is the mean of their V rows. Keys that the
  mask leaves visible but a -inf bias hides keep -inf and weight 0;
- if no key is hidden by the mask (the row is emptied by -inf bias alone), every logit is -inf and
  the softmax is 0/0: the row is NaN.

This differs from the vocabulary's `mean_of_values` ("the mean of V over the keys that a -inf bias
does not hide") exactly where a key is hidden by both the mask and a -inf bias: flax gives it the
uniform weight. For equinox (no bias) the two coincide.

Gradients: the masked logits are constants (the `where` selects a constant there), so no gradient
reaches Q, K or the bias through them; the uniform weights of a row in the first group send
dO / n into the dV rows of its n mask-hidden keys and nothing into dQ, dK, dBias (the softmax
Jacobian of equal weights applied to a gradient that is zero at every non-constant logit). A NaN
row makes its dQ and, through P^T dO and dS^T Q, every dK and dV row of its (batch, head) NaN.

`masked_logits_constant(case)` returns the expected float64 values of every element (not only the
covered rows): {"out", "dq", "dk", "dv", "dbias"} (gradients only when the case has grad_out, dbias
only when it has a bias). NaN in an expected array means "must be NaN". NumPy only.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, visibility


def masked_logits_constant(case: Case) -> dict[str, np.ndarray]:
    """Expected out (and gradients) when masked logits are a constant below every finite logit."""
    s = case.shape
    if s["Hkv"] != s["Hq"]:
        raise ValueError("masked_logits_constant is defined for Hq == Hkv (flax and equinox have no GQA)")
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    hidden_by_mask = ~visibility(full, mask=case.mask, causal=case.causal, q_lengths=case.q_lengths,
                                 kv_lengths=case.kv_lengths)
    scale = case.effective_scale
    q, k, v = case.q, case.k, case.v
    logits = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if case.bias is not None:
        logits = logits + np.broadcast_to(case.bias, full)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # the constant: -inf relative to every finite logit, but equal among the mask-hidden keys
        finite_max = np.where(hidden_by_mask | np.isneginf(logits), -np.inf, logits).max(axis=-1, keepdims=True)
        has_finite = np.isfinite(finite_max)
        shifted = np.where(hidden_by_mask, -np.inf, logits - np.where(has_finite, finite_max, 0.0))
        e = np.exp(shifted)
        # rows with no finite logit: mask-hidden keys get exp(0) = 1 each, -inf-bias keys 0; none hidden -> 0/0
        e = np.where(~has_finite & hidden_by_mask, 1.0, e)
        total = e.sum(axis=-1, keepdims=True)
        p = e / total                                   # NaN where total == 0
        out = np.einsum("bhij,bhjd->bhid", p, v)
        result = {"out": out}
        if case.grad_out is None:
            return result
        do = case.grad_out
        dv = np.einsum("bhij,bhid->bhjd", p, do)
        dp = np.einsum("bhid,bhjd->bhij", do, v)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        ds = np.where(hidden_by_mask, 0.0, ds)          # constants: no gradient through masked logits
        ds = np.where(np.isneginf(logits) & ~hidden_by_mask, 0.0, ds)   # exp(-inf) = 0 has zero slope
        nan_rows = np.isnan(p).any(axis=-1, keepdims=True)
        ds = np.where(nan_rows, np.nan, ds)
        dq = scale * np.einsum("bhij,bhjd->bhid", ds, k)
        dk = scale * np.einsum("bhij,bhid->bhjd", ds, q)
        result.update(dq=dq, dk=dk, dv=dv)
        if case.bias is not None:
            db = ds
            for axis, n in enumerate(np.shape(case.bias) if np.ndim(case.bias) == 4 else
                                     (1,) * (4 - np.ndim(case.bias)) + np.shape(case.bias)):
                if n == 1:
                    db = db.sum(axis=axis, keepdims=True)
            result["dbias"] = db.reshape(case.bias.shape)
    return result


ALTERNATIVES = {"masked_logits_constant": masked_logits_constant}


def output_dtype_float32(case: Case) -> dict[str, np.ndarray]:
    """`flax.linen.dot_product_attention(..., force_fp32_for_softmax=True)` on float16/bfloat16 inputs:
    the weights stay float32, so P V promotes to float32 and `out` comes back float32 instead of the
    input dtype (ATTN-OP-5). Check: out.dtype == float32, and its values against the reference under
    the tolerance model of the case's own dtype (they are at least that accurate: nothing is rounded
    to the half type after the logits). Returns the reference values; the dtype is the alternative."""
    from attnconf.reference import oracle

    return {"out": oracle(case).out, "out_dtype": np.array("float32")}


ALTERNATIVES["output_dtype_float32"] = output_dtype_float32
