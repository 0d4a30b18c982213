"""The backward of a naive implementation whose dot products accumulate in the half type.

Not a yardstick of the spec (ATTN-TOL-5 allows float32 accumulation, `emulate_backward`): it states
what "accumulates in half precision" means for gradients where a divergence declares it (the
`half_accumulation_gradients` alternative), as `emulate.naive_forward_half_accumulation` does for the
output. Autograd through that forward, every product accumulated in the dtype by `emulate.half_matmul`:

    P32 = the float32 softmax of a Q K^T accumulated in the dtype, P = P32 rounded (what P V saw),
    dV = P^T dO,  dP = dO V^T,  dS = P32 * (dP - rowsum(P32 * dP)) in float32,
    scale on the logits: dX = r(dS * scale), dQ = dX K,  dK = dX^T Q,
    scale on Q:          dX = r(dS),         dQ = r((dX K) * scale),  dK = dX^T Qs,
    dBias = dS reduced to the bias shape, rounded.

The softmax's own gradient uses the float32 weights, as autograd through a cast does (Keras casts its
float32 softmax to the dtype before P V); the error of the logits' accumulation reaches every gradient
through P, which is why it shows at large head dims even where the backward's reductions are short
(measured on Keras eager, adapters/tensorflow/findings/TF-EAGER-HALF-ACCUMULATION.md). A GQA group's per-head dK
and dV are summed in the dtype, one rounding per addition (the gradient of repeating K and V).
"""
from __future__ import annotations

import numpy as np

from attnconf.spec.vocabulary import HALF_DTYPES

from .attention import expand_kv, oracle
from .backward import reduce_to_shape
from .case import Case
from .emulate import (HALF_ACCUMULATION_ORDERS, HALF_ACCUMULATION_SCALINGS, _rounder, half_accumulation_weights,
                      half_matmul)
from .emulate_backward import largest_gradient_errors


def naive_backward_half_accumulation(case: Case, order: str = "ascending", scaling: str = "q") -> dict[str, np.ndarray]:
    """{"dq", "dk", "dv"[, "dbias"]} (float64) of the half-accumulating naive backward in `order` and `scaling`."""
    if case.dtype not in HALF_DTYPES:
        raise ValueError(f"half accumulation concerns float16 and bfloat16, not {case.dtype}")
    if case.grad_out is None:
        raise ValueError("the case has no grad_out; build it with grad_out=... to get gradients")
    key = ("naive_backward_half_accumulation", case.dtype, order, scaling)
    if key in case._cache:
        return case._cache[key]
    dt = case.dtype
    r = _rounder(dt)
    f32 = np.float32
    B, Hq = case.q.shape[:2]
    Hkv = case.k.shape[1]

    def group_sum(x: np.ndarray) -> np.ndarray:       # (B, Hq, L, D) -> (B, Hkv, L, D), summed in the dtype
        g = x.reshape(B, Hkv, Hq // Hkv, *x.shape[2:])
        acc = g[:, :, 0]
        for i in range(1, g.shape[2]):
            acc = r(acc + g[:, :, i])
        return acc

    def t(x: np.ndarray) -> np.ndarray:
        return np.swapaxes(x, -1, -2)

    with np.errstate(all="ignore"):
        scale = f32(case.effective_scale)
        vis = oracle(case).visible
        w32 = half_accumulation_weights(case, order, scaling)
        w = r(w32)
        q = r(case.q.astype(f32) * scale) if scaling == "q" else case.q.astype(f32)
        k, v = (np.where(np.isfinite(x), x, f32(0)) for x in (expand_kv(case.k, Hq).astype(f32),
                                                                expand_kv(case.v, Hq).astype(f32)))
        do = r(case.grad_out.astype(f32))
        dv = group_sum(half_matmul(t(w), do, dt, order))
        dp = half_matmul(do, t(v), dt, order)
        ds = np.where(vis, w32 * (dp - (w32 * dp).sum(axis=-1, keepdims=True, dtype=f32)), f32(0)).astype(f32)
        if scaling == "q":
            dx = r(ds)
            dq = r(half_matmul(dx, k, dt, order) * scale)
        else:
            dx = r(ds * scale)
            dq = half_matmul(dx, k, dt, order)
        dk = group_sum(half_matmul(t(dx), q, dt, order))
        grads = {"dq": dq, "dk": dk, "dv": dv}
        if case.bias is not None:
            grads["dbias"] = r(reduce_to_shape(ds, np.shape(case.bias)).astype(f32))
    result = {name: g.astype(np.float64) for name, g in grads.items()}
    case._cache[key] = result
    return result


def half_accumulation_gradient_error(case: Case) -> dict[str, np.ndarray]:
    """Per gradient, the elementwise max over every order and scaling of |g_naive - g_ref| of the
    half-accumulating backward: which order an implementation sums in is not observable from outside."""
    key = ("half_accumulation_gradient_error",)
    if key not in case._cache:
        case._cache[key] = largest_gradient_errors(case, (
            naive_backward_half_accumulation(case, order, scaling)
            for order in HALF_ACCUMULATION_ORDERS for scaling in HALF_ACCUMULATION_SCALINGS))
    return case._cache[key]
