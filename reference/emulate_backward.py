"""The naive backward at the precision under test: the gradient yardstick of ATTN-TOL-5.

Mirrors `reference.emulate.naive_forward`: what autograd through a straightforward
implementation in dtype t computes. The forward stages are redone exactly as the
naive forward does them (Q pre-scaled, logits, weights, output, each rounded to t),
then each backward stage is a float32-accumulated product rounded to t:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),
    dQs = dS K,  dQ = scale * dQs,  dK = dS^T Qs,  dBias = dS reduced to the bias shape.

The softmax backward uses rowsum(P * dP) as autograd's softmax rule does (it never
sees O). For float32 every stage runs in float32. GQA sums over each group are part
of the same float32 accumulation as the product that produces them.

The variants of SPEC section 12.5: ALiBi and the window change P only. A softcap
`c * tanh(x / c)` is differentiated the way autograd at t does it, one rounding per
operation: `dX = ((dS * c) * (1 - y^2)) / c` with y the forward's rounded tanh. A sink
is the last column of the naive softmax with no value, so dP there is 0 and its
gradient is `dsink[h] = -sum_(b, i) P_sink * rowsum(P * dP)`, summed sequentially in
float32 and rounded to t.

As for the forward, the yardstick is an envelope: the weights P come from each of the
forward's orderings (scale on Q, on the logits, or sqrt(scale) on both; products
accumulated ascending, descending or by BLAS), the backward products accumulate in the
same order, and `gradient_baseline_error` takes the largest error of these nine variants
per element (measured: with one ordering, torch's CPU MATH dV in float32 on logits of
order 1e3 was 5x the baseline on one case, though each run is a correct computation).
"""
from __future__ import annotations

import numpy as np

import itertools
from typing import Iterable

from .attention import expand_kv, oracle
from .backward import backward, reduce_to_shape
from .case import Case
from .emulate import ACCUMULATIONS, SCALINGS, _rounder, naive_softmax_parts, seq_matmul
from .shared_results import SharedResults, content_key

BACKWARD_VARIANTS = tuple(itertools.product(SCALINGS, ACCUMULATIONS))


def naive_backward(case: Case, dtype: str | None = None,
                   variant: tuple[str, str] = ("q", "blas")) -> dict[str, np.ndarray]:
    """{"dq", "dk", "dv"[, "dbias"]} of one naive backward variant at `dtype` (default: the case's), float64."""
    dtype = dtype or case.dtype
    if dtype == "float64":
        raise ValueError("there is no emulated baseline for float64; use the analytic bound")
    if case.grad_out is None:
        raise ValueError("the case has no grad_out; build it with grad_out=... to get gradients")
    key = ("naive_backward", dtype, variant)
    scaling, acc = variant
    if key in case._cache:
        return case._cache[key]
    if scaling in ("fused", "upcast") and dtype == "float32":     # the "logits" variant exactly (emulate.SCALINGS)
        case._cache[key] = naive_backward(case, dtype, ("logits", acc))
        return case._cache[key]
    r = _rounder(dtype)
    f32 = np.float32
    B, Hq, Lq, _ = case.q.shape
    Hkv, Lk = case.k.shape[1], case.k.shape[2]
    scale = f32(case.effective_scale)

    def group_sum(x):  # (B, Hq, L, D) float32 -> (B, Hkv, L, D), still float32
        return x.reshape(B, Hkv, Hq // Hkv, *x.shape[2:]).sum(axis=2, dtype=f32)

    with np.errstate(all="ignore"):
        qs = r(case.q.astype(f32) * scale)
        k = expand_kv(case.k, Hq).astype(f32)
        v = expand_kv(case.v, Hq).astype(f32)
        k, v = np.where(np.isfinite(k), k, f32(0)), np.where(np.isfinite(v), v, f32(0))
        do = r(case.grad_out.astype(f32))
        vis = oracle(case).visible
        p, l, m = naive_softmax_parts(case, scaling, acc, dtype)
        w = r(np.where(l > 0, p / np.where(l > 0, l, f32(1)), f32(0)).astype(f32))

        dv = r(group_sum(seq_matmul(np.swapaxes(w, -1, -2), do, acc)))
        dp = r(seq_matmul(do, np.swapaxes(v, -1, -2), acc))
        rowdot = (w * dp).sum(axis=-1, keepdims=True, dtype=f32)
        ds = r(np.where(vis, w * (dp - rowdot), f32(0)).astype(f32))
        dx = ds
        if case.softcap is not None:
            c = f32(case.softcap)
            y = case._cache[("softcap_tanh", dtype, scaling, acc)]
            dx = r(np.where(vis, r(r(ds * c) * (f32(1) - y * y)) / c, f32(0)).astype(f32))
        dq = r(r(seq_matmul(dx, k, acc)) * scale)
        dk = r(group_sum(seq_matmul(np.swapaxes(dx, -1, -2), qs, acc)))
        grads = {"dq": dq, "dk": dk, "dv": dv}
        if case.bias is not None:
            grads["dbias"] = r(reduce_to_shape(ds, np.shape(case.bias)).astype(f32))
        if case.sinks is not None:
            sink = case.sinks.astype(f32)[None, :, None]
            p_sink = r(np.exp(sink - m[..., 0]) / np.where(l[..., 0] > 0, l[..., 0], f32(1)))     # (B, Hq, Lq)
            terms = np.moveaxis(-(p_sink * rowdot[..., 0]), 1, -1).reshape(-1, Hq).astype(f32)
            grads["dsinks"] = r(np.cumsum(terms, axis=0, dtype=f32)[-1] if len(terms) else np.zeros(Hq, f32))
    result = {name: g.astype(np.float64) for name, g in grads.items()}
    case._cache[key] = result
    return result


def gradient_baseline_error(case: Case, dtype: str | None = None) -> dict[str, np.ndarray]:
    """Elementwise max over the backward variants of |g_naive - g_ref|, per gradient."""
    dtype = dtype or case.dtype
    key = ("gradient_baseline_error", dtype)
    if key in case._cache:
        return case._cache[key]
    shared = _SHARED_GRADIENT_BASELINES.get(content_key(case, dtype))
    if shared is not None:
        case._cache[key] = dict(shared)
        return case._cache[key]
    err = largest_gradient_errors(case, (naive_backward(case, dtype, v) for v in BACKWARD_VARIANTS))
    for arr in err.values():
        arr.flags.writeable = False      # shared by every case of the same content
    case._cache[key] = err
    _SHARED_GRADIENT_BASELINES.put(content_key(case, dtype), err)
    return err


_SHARED_GRADIENT_BASELINES = SharedResults("gradient_baseline_error", 128 << 20)


def largest_gradient_errors(case: Case, variants: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per gradient, the elementwise max of |g - g_ref| over the gradients of `variants` (non-finite
    differences count 0): what an envelope of naive backwards allows."""
    ref = backward(case)
    err: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for grads in variants:
            for name, g in grads.items():
                e = np.abs(g - getattr(ref, name))
                e = np.where(np.isfinite(e), e, 0.0)
                err[name] = e if name not in err else np.maximum(err[name], e)
    return err
