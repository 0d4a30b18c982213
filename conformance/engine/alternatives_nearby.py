"""Alternatives that are the spec applied to a nearby problem: the case with its scale rounded to float32,
with the keys that a boolean mask hides given a finite bias, or with the mask ignored; each judged with
that problem's own reference and baseline (`_judge_against`, which backends' alternatives use too).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives_registry import FORWARD, GRADIENTS, Verdict, _judged, alternative
from attnconf.reference import Case, oracle

# ---- the reference of a nearby problem --------------------------------------------------

def _judge_against(alt: Case, case: Case, res, masks) -> Verdict:
    if "out" in masks:
        j = T.judge_output(np.asarray(res.out), alt, mask=masks["out"])
        if not j.ok:
            return _judged(j)
    if "lse" in masks and res.lse is not None:
        j = T.judge_lse(np.asarray(res.lse), alt, mask=masks["lse"])
        if not j.ok:
            return _judged(j)
    if "weights" in masks and getattr(res, "weights", None) is not None:
        j = T.judge_output(np.asarray(res.weights), T.weights_as_output(alt), mask=masks["weights"])
        if not j.ok:
            return _judged(j)
    if res.grads and any(g in masks for g in GRADIENTS) and alt.grad_out is not None:
        for j in T.judge_gradients({n: np.asarray(g) for n, g in res.grads.items()}, alt,
                                   masks={n: m for n, m in masks.items() if n in GRADIENTS}):
            if not j.ok:
                return _judged(j)
    return Verdict(True)


@alternative("scale_float32", FORWARD + GRADIENTS + ("layer",), numeric=True)
def _scale_float32(entry, case, res, masks) -> Verdict:
    """The reference with the scale in float32 (as Keras computes it), under the float64 bound."""
    if hasattr(case, "num_heads"):
        from attnconf.reference import forward
        from attnconf.reference.layer import mha

        s32 = float(np.float32(1.0 / np.sqrt(case.head_dim)))
        expected = mha(case, lambda q, k, v, **kw: forward(q, k, v, scale=s32, **kw).out)
        return _judged(T.judge_layer(res.out, case, mask=masks["out"], ref=expected))
    return _judge_against(scale_float32_case(case), case, res, masks)


def scale_float32_case(case: Case) -> Case:
    """The case with the scale as Keras computes it in float32: the default 1 / sqrt(float32(Dk)) (two
    float32 roundings, which can differ from float32(1 / sqrt(Dk)) by one ulp: Dk = 72, measured), a
    given scale cast once. Other entries' alternatives are judged on it where this one applies too."""
    s32 = np.float32(1.0) / np.sqrt(np.float32(case.shape["Dk"])) if case.scale is None else np.float32(case.scale)
    return case.replace(scale=float(s32))


@alternative("finite_mask_bias", FORWARD + GRADIENTS, numeric=True)
def _finite_mask_bias(entry, case, res, masks) -> Verdict:
    """The reference with the keys that the kernel receives as a boolean mask given the finite bias
    `value` instead of -inf (see finite_mask_bias_case)."""
    return _judge_against(finite_mask_bias_case(case, float(entry["value"]), entry.get("finite_for")), case, res, masks)


FINITE_SOURCES = ("mask", "causal", "window", "q_lengths", "kv_lengths")


def finite_mask_bias_case(case: Case, value: float, finite_for: list[str] | None = None) -> Case:
    """The case as a kernel computes it that turns what hides keys into one boolean mask and adds that
    mask as the finite bias `value`: a hidden key's logit becomes float32(logit + value), carried as an
    unrounded float64 bias. With -32768 the logits' differences survive (a row that sees no key attends over
    its hidden keys); with -2**41 in bfloat16 they do not (uniform weights: the mean of V over those
    keys). `finite_for` names which of FINITE_SOURCES the kernel receives in that mask (default all: an
    SDPA-convention call folds mask, causal alignment, window and padding together); the others, and a
    -inf bias, hide keys as the spec says."""
    srcs = set(FINITE_SOURCES if finite_for is None else finite_for)
    s = case.shape
    full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    from attnconf.reference import visibility

    lengths = {"q_lengths": case.q_lengths, "kv_lengths": case.kv_lengths}
    padded = ~visibility(full, **lengths)

    def hidden_by(name: str) -> np.ndarray:
        if name == "mask":
            return ~visibility(full, mask=case.mask)
        if name in lengths:
            return ~visibility(full, **{name: lengths[name]})
        # causal alignment and windows sit where the lengths put them (bottom-right: at each sequence's end)
        extra = {"causal": case.causal} if name == "causal" else {"window": case.window, "window_align": case.window_align}
        return ~visibility(full, **extra, **lengths) & ~padded
    present = [n for n in FINITE_SOURCES if n in srcs and getattr(case, n) is not None]
    hidden = np.zeros(full, dtype=bool)
    for name in present:
        hidden |= hidden_by(name)
    if not hidden.any():
        return case
    logits = oracle(case).logits
    ok = hidden & np.isfinite(logits)
    s_ok = np.where(ok, logits, 0.0)
    shift = np.where(ok, np.asarray(np.float32(s_ok + value), dtype=np.float64) - s_ok, 0.0)
    bias = shift if case.bias is None else np.broadcast_to(case.bias, full) + shift
    # not Case.replace: it would round the bias to the case's dtype, and a bias of -2**41 - logit rounded
    # to bfloat16 is -2**41 again, which gives the logits' differences back in the float64 reference
    alt = dataclasses.replace(case, bias=bias, _cache={}, **dict.fromkeys(present))
    alt.validate()
    return alt


@alternative("unmasked", FORWARD)
def _unmasked(entry, case, res, masks) -> Verdict:
    """The reference with the boolean mask ignored (on the covered rows)."""
    return _judge_against(case.replace(mask=None), case, res, masks)
