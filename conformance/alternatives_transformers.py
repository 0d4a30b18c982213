"""What transformers' attention functions compute instead, where they depart from the spec.

Each function takes a `Case` and returns the expected values per quantity (float64 arrays of the
quantity's full shape); a divergence entry's region says which elements are compared. They describe
transformers 5.23.0 on torch 2.13.0 (CPU), measured in tests/test_adapter_transformers.py.

Background: transformers never masks with -inf. Its masks (`masking_utils.eager_mask`, and the merge of a
boolean mask with a float bias in `integrations/sdpa_attention.py::create_position_bias_mask`) put
`torch.finfo(dtype).min` on hidden keys, so a query row that sees no key still has a softmax over finite
logits. Which value comes out depends on where the minimum is added and in which precision:

- float32, bfloat16 (and float64 where it stays float64): `logit + finfo.min` rounds to `finfo.min` for every
  hidden key, so the row's weights are uniform over the keys hidden by a boolean source (the mask, causal
  alignment, window or padding): the mean of their values (`mean_of_values` of spec/divergences/README.md);
- float16 in the eager functions: the sum is rounded to float16, whose spacing at 65504 is 32, so hidden
  logits fall into buckets 32 apart and only the top bucket keeps weight (`eager_float16_min_mask`);
- sdpa with a bias: torch adds the merged float mask to logits it holds in float32, where float16's
  -65504 is exact: the hidden keys keep their own logits, lowered by 65504 (`finfo_min_mask`).

The gradients follow the additive mask: d(logit + min)/d(logit) = 1, so the uniform weights of an empty
row back-propagate into dQ and dK (`uniform_weight_gradients_through_logits`), unlike an implementation that
replaces the masked logits by constants (the README's `uniform_weight_gradients`, whose dQ is 0).
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case, expand_kv, oracle, visibility
from attnconf.reference.backward import group_sum, reduce_to_shape
from attnconf.reference.case import round_to

F16_MIN = -65504.0


def mask_hidden_keys(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk): keys hidden by the boolean mask, causal alignment, a window or padding (not by bias)."""
    s = case.shape
    return ~visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                       q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                       window_align=case.window_align)


def empty_rows(case: Case) -> np.ndarray:
    """(B, Hq, Lq): rows that see no key."""
    return ~oracle(case).visible.any(axis=-1)


def _scaled_logits(case: Case, rnd=None) -> np.ndarray:
    """softcap(scale * Q K^T) per (B, Hq, Lq, Lk), each step rounded by `rnd` when given."""
    r = rnd or (lambda x: x)
    with np.errstate(all="ignore"):
        x = r(r(np.einsum("bhid,bhjd->bhij", case.q, expand_kv(case.k, case.shape["Hq"]))) * case.effective_scale)
        if case.softcap is not None:
            c = case.softcap
            x = r(r(np.tanh(r(x / c))) * c)
    return x


def _softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        m = np.max(x, axis=-1, keepdims=True)
        e = np.exp(x - m)
        return e / e.sum(axis=-1, keepdims=True)


def _weighted(w: np.ndarray, case: Case) -> np.ndarray:
    v = expand_kv(case.v, case.shape["Hq"])
    return np.einsum("bhij,bhjd->bhid", w, np.where(np.isfinite(v), v, 0.0))


def uniform_mask_hidden_weights(case: Case) -> np.ndarray:
    """The weights of the finfo.min convention where the minimum absorbs the logit: the reference weights,
    except that every empty row is uniform over its mask-hidden keys."""
    hidden = mask_hidden_keys(case)
    rows = empty_rows(case) & hidden.any(axis=-1)
    n = np.maximum(hidden.sum(axis=-1, keepdims=True), 1)
    uniform = np.where(hidden, 1.0 / n, 0.0)
    return np.where(rows[..., None], uniform, oracle(case).weights)


def mean_of_mask_hidden_values(case: Case) -> dict[str, np.ndarray]:
    """Empty rows output the mean of V over their mask-hidden keys (the README's `mean_of_values`)."""
    return {"out": _weighted(uniform_mask_hidden_weights(case), case)}


def eager_float16_min_mask(case: Case) -> dict[str, np.ndarray]:
    """The float16 eager functions (llama's, gemma2's) step by step, with transformers' mask.

    Every step rounds to float16 as torch does on CPU: the logits `Q K^T`, `* scaling` (and softcap's
    `/ c`, `tanh`, `* c`), then `+ attention_mask`, whose hidden entries are -65504 (`finfo(float16).min`),
    or the bias where a custom mask carries one (`where(visible, bias, -65504)`); the softmax runs in
    float32 (here float64) and its weights are rounded to float16 before `weights @ V`. A hidden logit s
    lands on -65504 + 32 * round(s / 32), so an empty row weighs uniformly the keys of its largest bucket
    and gives the others weights below exp(-32), which round to 0. Rows that see a key come out as the
    reference does, within float16 rounding."""
    r16 = lambda x: round_to(x, "float16")  # noqa: E731
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    logits = _scaled_logits(case, r16)
    hidden = mask_hidden_keys(case)
    bias = np.zeros(full) if case.bias is None else np.broadcast_to(case.bias, full)
    added = np.where(hidden, F16_MIN, bias)
    with np.errstate(all="ignore"):
        x = r16(logits + added)
        w = r16(_softmax(x))
        out = r16(_weighted(w, case))
    return {"out": out}


FINFO_MIN = {"float64": float(np.finfo(np.float64).min), "float32": float(np.finfo(np.float32).min),
             "float16": F16_MIN, "bfloat16": -3.3895313892515355e38}


def finfo_min_mask_weights(case: Case) -> np.ndarray:
    """The weights of `finfo_min_mask`: softmax over every key not hidden by -inf bias of
    s_ij + (finfo(dtype).min where a boolean source hides key j, else bias_ij), in float64."""
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    bias = np.zeros(full) if case.bias is None else np.broadcast_to(case.bias, full)
    x = _scaled_logits(case) + np.where(mask_hidden_keys(case), FINFO_MIN[case.dtype], bias)
    return np.nan_to_num(_softmax(x))


def finfo_min_mask(case: Case) -> dict[str, np.ndarray]:
    """sdpa with a bias: transformers merges the boolean mask and the bias as
    `where(mask, position_bias, finfo(dtype).min)` and torch adds that to logits it holds in float32 (or
    float64), where the minimum is exact. So hidden keys are not hidden but pushed down by |finfo.min|:
    an empty row is the softmax of its hidden keys' own logits (float16: -65504 is exact in float32) or
    their mean (float32, bfloat16, float64: the minimum absorbs the logit), and in float16 a hidden key
    whose logit beats the row's visible ones by more than 65504 takes the weight. Computed in float64."""
    return {"out": _weighted(finfo_min_mask_weights(case), case)}


def _empty_row_weights(case: Case, how: str) -> np.ndarray:
    """The reference weights, with every empty row replaced by what the given convention gives it."""
    if how == "uniform":
        return uniform_mask_hidden_weights(case)
    s = case.shape
    rows = empty_rows(case)
    hidden = mask_hidden_keys(case)
    if how == "eager_float16":
        r16 = lambda x: round_to(x, "float16")  # noqa: E731
        full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
        bias = np.zeros(full) if case.bias is None else np.broadcast_to(case.bias, full)
        with np.errstate(all="ignore"):
            w = _softmax(r16(_scaled_logits(case, r16) + np.where(hidden, F16_MIN, bias)))
    elif how == "finfo_min":
        return finfo_min_mask_weights(case)
    else:
        raise ValueError(f"unknown convention {how!r}")
    return np.where(rows[..., None], np.nan_to_num(w), oracle(case).weights)


def _gradients_through_logits(case: Case, P: np.ndarray) -> dict[str, np.ndarray]:
    """ATTN-GRAD-1's formulas with the weights P, every logit differentiable (the mask was added):

        dV = P^T dO, dS = P (dO V^T - rowsum(dO * P V)) [* softcap'], dQ = s dS K, dK = s dS^T Q,
        dBias = dS where no boolean source hides the key (elsewhere transformers replaced the bias)."""
    if case.grad_out is None:
        raise ValueError("the gradient alternatives need case.grad_out")
    s = case.shape
    v = expand_kv(case.v, s["Hq"])
    k = expand_kv(case.k, s["Hq"])
    do = case.grad_out
    with np.errstate(all="ignore"):
        o = np.einsum("bhij,bhjd->bhid", P, v)
        dp = np.einsum("bhid,bhjd->bhij", do, v)
        ds = P * (dp - (do * o).sum(axis=-1, keepdims=True))
        dlogit = ds
        if case.softcap is not None:
            raw = case.effective_scale * np.einsum("bhid,bhjd->bhij", case.q, k)
            dlogit = ds * (1.0 - np.tanh(raw / case.softcap) ** 2)
        sc = case.effective_scale
        dq = sc * np.einsum("bhij,bhjd->bhid", dlogit, k)
        dk = group_sum(sc * np.einsum("bhij,bhid->bhjd", dlogit, case.q), s["Hkv"])
        dv = group_sum(np.einsum("bhij,bhid->bhjd", P, do), s["Hkv"])
    out = {"dq": dq, "dk": dk, "dv": dv}
    if case.bias is not None:
        out["dbias"] = reduce_to_shape(np.where(mask_hidden_keys(case), 0.0, ds), case.bias.shape)
    return out


def uniform_weight_gradients_through_logits(case: Case) -> dict[str, np.ndarray]:
    """The eager functions' gradients: an empty row's weights are those of the forward (uniform over its
    mask-hidden keys; in float16 `eager_float16_min_mask`'s top bucket), and because the mask is *added*
    (d(s + min)/ds = 1) their softmax derivative reaches dQ and dK, unlike the README's
    `uniform_weight_gradients`, whose masked logits are constants (dQ = 0)."""
    return _gradients_through_logits(case, _empty_row_weights(case, "eager_float16" if case.dtype == "float16"
                                                              else "uniform"))


def position_bias_mask_gradients(case: Case) -> dict[str, np.ndarray]:
    """sdpa with a bias: the gradients through `where(mask, position_bias, finfo.min)` added to the
    logits, with the weights of `finfo_min_mask` (so, like `uniform_weight_gradients_through_logits`,
    the covered rows' softmax derivative reaches dQ and dK; dBias is 0 on hidden keys)."""
    return _gradients_through_logits(case, _empty_row_weights(case, "finfo_min"))


ALTERNATIVES = {
    "eager_float16_min_mask": eager_float16_min_mask,
    "uniform_weight_gradients_through_logits": uniform_weight_gradients_through_logits,
    "position_bias_mask_gradients": position_bias_mask_gradients,
    "finfo_min_mask": finfo_min_mask,
}
