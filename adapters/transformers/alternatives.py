"""What transformers' attention functions compute instead, where they depart from the spec.

Each function takes a `Case` and returns the expected values per quantity (float64 arrays of the
quantity's full shape); a divergence entry's region says which elements are compared. They describe
transformers 5.23.0 on torch 2.13.0 (CPU), measured in adapters/transformers/tests/test_adapter_transformers.py.

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

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives import FORWARD, GRADIENTS, Verdict, _exact, _judged, alternative
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


def cache_evicted_keys(case: Case) -> np.ndarray:
    """(Lk,) keys a sliding layer's DynamicCache no longer holds, so they are in no softmax at all (not even
    with finfo.min): with window (w - 1, 0) (causal-like, `sliding_window = w >= 2`) and P = Lk - Lq cached
    tokens, the cache keeps the last w - 1 of them, so keys j < P - (w - 1) are gone (w = 1 keeps every
    key: TRANSFORMERS-SLIDING-WINDOW-1-CACHE)."""
    s = case.shape
    gone = np.zeros(s["Lk"], dtype=bool)
    if case.window is None or tuple(case.window) == (-1, -1):
        return gone
    left, right = case.window
    if (case.causal is not None or right == 0) and left >= 1:
        gone[:max(0, s["Lk"] - s["Lq"] - left)] = True
    return gone


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
    # torch adds the float mask to logits it holds in float32 (float64 for float64 inputs): the sum is
    # rounded there, so a logit below half the spacing at finfo.min (2^103 ~ 1e31 in float32) is absorbed
    # and a larger one is not (measured: test_masked_positions_have_no_effect, hidden keys ~1e30)
    with np.errstate(all="ignore"):
        x = round_to(_scaled_logits(case) + np.where(mask_hidden_keys(case), FINFO_MIN[case.dtype], bias),
                     "float64" if case.dtype == "float64" else "float32")
        x = np.where(cache_evicted_keys(case), -np.inf, x)
    return np.nan_to_num(_softmax(x))


def finfo_min_mask(case: Case) -> dict[str, np.ndarray]:
    """sdpa with a bias: transformers merges the boolean mask and the bias as
    `where(mask, position_bias, finfo(dtype).min)` and torch adds that to logits it holds in float32 (or
    float64), where the minimum is exact. So hidden keys are not hidden but pushed down by |finfo.min|:
    an empty row is the softmax of its hidden keys' own logits (float16: -65504 is exact in float32) or
    their mean (float32, bfloat16, float64: the minimum absorbs the logit), and in float16 a hidden key
    whose logit beats the row's visible ones by more than 65504 takes the weight. Computed in float64."""
    w = finfo_min_mask_weights(case)
    return {"out": _weighted(w, case), "out_weights": w}


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
    """The eager functions' gradients: an empty row's weights are those of the forward
    (`eager_min_mask_weights`: uniform over its mask-hidden keys where the minimum absorbs the logits,
    float16's top bucket, NaN where the sum overflows or, in float64, where finfo(float64).min becomes
    -inf in the float32 softmax), and because the mask is *added* (d(s + min)/ds = 1) their softmax
    derivative reaches dQ and dK, unlike the README's `uniform_weight_gradients`, whose masked logits are
    constants (dQ = 0). dBias is 0 where a boolean source hides the key (torch.where)."""
    return _gradients_through_logits(case, eager_min_mask_weights(case))


def position_bias_mask_gradients(case: Case) -> dict[str, np.ndarray]:
    """sdpa with a bias: the gradients through `where(mask, position_bias, finfo.min)` added to the
    logits, with the weights of `finfo_min_mask` (so, like `uniform_weight_gradients_through_logits`,
    the covered rows' softmax derivative reaches dQ and dK; dBias is 0 on hidden keys)."""
    return _gradients_through_logits(case, _empty_row_weights(case, "finfo_min"))


# ---- the eager functions step by step, in every dtype ------------------------------------------------

def eager_softmax_input(case: Case) -> np.ndarray:
    """(B, Hq, Lq, Lk): what `nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32)` receives in
    llama's and gemma2's eager functions: `Q K^T * scaling` (softcap: `/ c`, `tanh`, `* c`) plus the mask
    (finfo(dtype).min on keys a boolean source hides, the bias elsewhere), every step rounded to the input
    dtype, then cast to float32 by the softmax's `dtype=`. So in float32 and bfloat16 a logit below half the
    spacing at finfo.min is absorbed (uniform weights) and a larger one is not; a negative one beyond it
    overflows to -inf; float16's spacing of 32 makes buckets; float64's finfo.min is -inf in float32."""
    key = ("eager_softmax_input",)          # read by several regions and alternatives of one case
    if key in case._cache:
        return case._cache[key]
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    dt = case.dtype
    r = (lambda x: x) if dt == "float64" else (lambda x: round_to(x, dt))  # noqa: E731
    bias = np.zeros(full) if case.bias is None else r(np.broadcast_to(case.bias, full))
    with np.errstate(all="ignore"):
        x = r(_scaled_logits(case, r) + np.where(mask_hidden_keys(case), FINFO_MIN[dt], bias))
    x = np.where(cache_evicted_keys(case), -np.inf, round_to(x, "float32"))
    x.flags.writeable = False
    case._cache[key] = x
    return x


def eager_min_mask_weights(case: Case) -> np.ndarray:
    """The weights the eager functions return: the reference's on rows that see a key, and on empty rows
    (in float16 on every row with a mask-hidden key) the softmax of `eager_softmax_input` (NaN where every
    entry is -inf), rounded to the dtype."""
    with np.errstate(all="ignore"):
        w = round_to(_softmax(eager_softmax_input(case)), case.dtype)
    rows = empty_rows(case)
    if case.dtype == "float16":  # -65504 is not absorbed: a hidden key can take weight in a row that sees keys
        rows = rows | mask_hidden_keys(case).any(axis=-1)
    return np.where(rows[..., None], w, oracle(case).weights)


def eager_min_mask_values(case: Case) -> dict[str, np.ndarray]:
    """Output and weights of the eager functions (`eager_min_mask_weights`, then `weights @ V`)."""
    w = eager_min_mask_weights(case)
    return {"out": _weighted(w, case), "weights": w}


def _naive(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(np.float32) if dtype != "float64" else x


class _InDtype:
    """A case whose arrays are held in float32 (Case itself keeps float64): NumPy then evaluates the
    formulas with float32 products and sums, as a naive float32 implementation would."""

    def __init__(self, case: Case, arrays: dict[str, np.ndarray]):
        self._case, self._arrays = case, arrays

    def __getattr__(self, name):
        return self._arrays[name] if name in self._arrays else getattr(self._case, name)


def _term_magnitudes(case: Case, P: np.ndarray) -> dict[str, np.ndarray]:
    """|terms| each quantity is summed from, for the weights P (the floor of the tolerance model is taken
    there: exact zeros arise by cancellation, e.g. dS of a row with one key)."""
    s = case.shape
    v = np.abs(np.nan_to_num(expand_kv(case.v, s["Hq"])))
    k = np.abs(expand_kv(case.k, s["Hq"]))
    a = np.abs(np.nan_to_num(P))
    out = {"out": np.einsum("bhij,bhjd->bhid", a, v), "weights": a}
    if case.grad_out is not None:
        do = np.abs(case.grad_out)
        dp = np.einsum("bhid,bhjd->bhij", do, v)
        ds = a * (dp + (do * out["out"]).sum(axis=-1, keepdims=True))
        sc = abs(case.effective_scale)
        out.update(dq=sc * np.einsum("bhij,bhjd->bhid", ds, k),
                   dk=group_sum(sc * np.einsum("bhij,bhid->bhjd", ds, np.abs(case.q)), s["Hkv"]),
                   dv=group_sum(np.einsum("bhij,bhid->bhjd", a, do), s["Hkv"]))
        if case.bias is not None:
            out["dbias"] = reduce_to_shape(ds, case.bias.shape)
    return out


def judge_values(case: Case, res, masks: dict[str, np.ndarray], exact: dict[str, np.ndarray],
                 naive: dict[str, np.ndarray], P: np.ndarray, as_dtype: str | None = None) -> Verdict:
    """Covered elements against `exact` (NaN = must be NaN) under the tolerance model of the dtype: the
    yardstick is the error of a naive implementation of the same alternative (`naive`: the same formulas
    evaluated in float32, rounded to the dtype) plus the spec's own baseline (for elements rows outside
    the region also feed; for the weights, that of `tolerance.weights_as_output`), the floor at the magnitude
    of the summed terms. float64 (unless judged as float32): the float64 analytic bound of SPEC section 12 at
    that magnitude."""
    from attnconf.reference import baseline_error
    from attnconf.reference.emulate_backward import gradient_baseline_error

    dt = as_dtype or case.dtype
    mags = _term_magnitudes(case, P)
    for q, m in masks.items():
        if q not in exact:
            continue
        actual = res.weights if q == "weights" else getattr(res, q) if q in FORWARD else (res.grads or {}).get(q)
        if actual is None:
            continue
        e = np.asarray(exact[q], dtype=np.float64)
        a = np.broadcast_to(np.asarray(actual, dtype=np.float64), e.shape)
        v = _exact(q, a, m & np.isnan(e), np.isnan, "NaN")
        if not v.ok:
            return v
        m = m & ~np.isnan(e)
        if not m.any():
            continue
        with np.errstate(all="ignore"):
            mag = np.maximum(np.abs(e), np.nan_to_num(mags.get(q, np.abs(e)), posinf=0.0))
        if dt == "float64":
            a_, _ = T._logit_magnitude(case)
            ka, kc = T._float64_terms(case)
            tol = T.spec.tolerances()["float64"]["gamma"] * T.EPS64 * (ka * float(a_.max(initial=0)) + kc
                                                                       + case.shape["Dv"])
            with np.errstate(invalid="ignore"):
                bad = m & ~(np.abs(a - e) <= tol * mag + T.TINY64)
            if bad.any():
                idx = _first(bad)
                return Verdict(False, f"{q} (float64) at {idx}: {a[idx]:.17g}, expected {e[idx]:.17g} "
                                      f"(bound {tol * mag[idx]:.3g})")
            continue
        with np.errstate(all="ignore"):
            base = np.nan_to_num(np.abs(np.asarray(naive[q], np.float64) - e), nan=0.0, posinf=0.0)
            c32 = case if case.dtype != "float64" else case.replace(dtype="float32")
            if q == "out":
                base = base + baseline_error(c32)[0]
            elif q == "weights":
                base = base + baseline_error(T.weights_as_output(c32))[0]
            elif q in GRADIENTS and case.grad_out is not None:
                base = base + np.broadcast_to(gradient_baseline_error(c32)[q], e.shape)
        model = "gradient" if q in GRADIENTS else "forward"
        j = T.judge_arrays(a, e, base, dt, quantity=q, model=model, magnitude=mag, mask=m)
        if not j.ok:
            return _judged(j)
    return Verdict(True)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _evaluate(case: Case, P: np.ndarray, *, naive: bool) -> dict[str, np.ndarray]:
    """out, weights and (with grad_out) the gradients through logits of the weights P; `naive` evaluates
    them in float32 (a naive implementation's yardstick) and rounds them to the case's dtype."""
    dt = case.dtype
    if not naive:
        res = {"out": _weighted(P, case), "weights": P}
        if case.grad_out is not None:
            res.update(_gradients_through_logits(case, P))
        return res
    c32 = _InDtype(case, {n: _naive(getattr(case, n), dt) for n in ("q", "k", "v", "grad_out")
                          if getattr(case, n) is not None})
    Pn = _naive(round_to(P, "float32"), dt)
    res = {"out": round_to(_weighted(Pn, c32), dt), "weights": round_to(Pn, dt)}
    if case.grad_out is not None:
        res.update({k: round_to(v, dt) for k, v in _gradients_through_logits(c32, Pn).items()})
    return res


@alternative("eager_min_mask", FORWARD + GRADIENTS + ("weights",), numeric=True)
def _eager_min_mask(entry, case, res, masks) -> Verdict:
    """The eager functions step by step (`eager_softmax_input`, `eager_min_mask_weights`): the output,
    the returned weights and the gradients through logits of those weights."""
    P = eager_min_mask_weights(case)
    return judge_values(case, res, masks, _evaluate(case, P, naive=False), _evaluate(case, P, naive=True), P,
                        entry.get("_as_dtype"))


@alternative("finfo_min_mask_through_logits", FORWARD + GRADIENTS + ("weights",), numeric=True)
def _finfo_min_mask_through_logits(entry, case, res, masks) -> Verdict:
    """sdpa with a bias (`finfo_min_mask_weights`: the merged mask added to logits torch holds in float32
    or float64): output and gradients through logits of those weights."""
    P = finfo_min_mask_weights(case)
    return judge_values(case, res, masks, _evaluate(case, P, naive=False), _evaluate(case, P, naive=True), P,
                        entry.get("_as_dtype"))


def sliding_window_one_decode_case(case: Case) -> Case:
    """What a decoding step (Lq = 1) with `sliding_window = 1` and a KV cache computes: the one-column mask
    (visible: the row's own key) broadcasts over every cached key, so the row attends to all Lk keys, the
    window, causal masking, the boolean mask and the padding gone; the bias (sdpa's position_bias) and
    softcap stay."""
    return case.replace(window=None, causal=None, mask=None, kv_lengths=None)


@alternative("sliding_window_one_decode", FORWARD + GRADIENTS + ("weights",), numeric=True)
def _sliding_window_one_decode(entry, case, res, masks) -> Verdict:
    """The reference of `sliding_window_one_decode_case` on the covered rows: output, weights, gradients."""
    alt = sliding_window_one_decode_case(case)
    P = oracle(alt).weights
    return judge_values(alt, res, masks, _evaluate(alt, P, naive=False), _evaluate(alt, P, naive=True), P,
                        entry.get("_as_dtype"))


@alternative("float32_softmax_weights", ("weights",), numeric=True)
def _float32_softmax_weights(entry, case, res, masks) -> Verdict:
    """The returned weights of a float64 call whose softmax runs in float32 (`softmax(..., dtype=float32)
    .to(float64)`): the reference weights under the float32 tolerance model, the yardstick being a naive
    float32 softmax of the float32-rounded logits."""
    P = oracle(case).weights
    with np.errstate(all="ignore"):
        x = np.where(oracle(case).visible, round_to(oracle(case).logits, "float32"), -np.inf)
        naive = round_to(_softmax(x), "float32")
    return judge_values(case, res, masks, {"weights": P}, {"weights": naive}, P, "float32")


ALTERNATIVES = {
    "eager_float16_min_mask": eager_float16_min_mask,
    "uniform_weight_gradients_through_logits": uniform_weight_gradients_through_logits,
    "position_bias_mask_gradients": position_bias_mask_gradients,
    "finfo_min_mask": finfo_min_mask,
}
