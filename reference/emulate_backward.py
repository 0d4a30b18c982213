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
"""
from __future__ import annotations

import numpy as np

from .attention import expand_kv, visibility
from .backward import reduce_to_shape
from .case import Case
from .emulate import _rounder


def naive_backward(case: Case, dtype: str | None = None) -> dict[str, np.ndarray]:
    """{"dq", "dk", "dv"[, "dbias"]} of the naive backward at `dtype` (default: the case's), float64."""
    dtype = dtype or case.dtype
    if dtype == "float64":
        raise ValueError("there is no emulated baseline for float64; use the analytic bound")
    if case.grad_out is None:
        raise ValueError("the case has no grad_out; build it with grad_out=... to get gradients")
    key = ("naive_backward", dtype)
    if key in case._cache:
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
        vis = visibility((B, Hq, Lq, Lk), mask=case.mask, bias=case.bias, causal=case.causal,
                         q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
        s = r(np.matmul(qs, np.swapaxes(k, -1, -2)))
        if case.bias is not None:
            s = r(s + np.broadcast_to(case.bias, s.shape).astype(f32))
        s = np.where(vis, s, -np.inf).astype(f32)
        m = s.max(axis=-1, keepdims=True) if Lk else np.full((B, Hq, Lq, 1), -np.inf, f32)
        m = np.where(np.isneginf(m), f32(0), m).astype(f32)
        p = np.where(vis, np.exp(s - m), f32(0)).astype(f32)
        l = p.sum(axis=-1, keepdims=True, dtype=f32)
        w = r(np.where(l > 0, p / np.where(l > 0, l, f32(1)), f32(0)).astype(f32))

        dv = r(group_sum(np.matmul(np.swapaxes(w, -1, -2), do)))
        dp = r(np.matmul(do, np.swapaxes(v, -1, -2)))
        rowdot = (w * dp).sum(axis=-1, keepdims=True, dtype=f32)
        ds = r(np.where(vis, w * (dp - rowdot), f32(0)).astype(f32))
        dq = r(r(np.matmul(ds, k)) * scale)
        dk = r(group_sum(np.matmul(np.swapaxes(ds, -1, -2), qs)))
        grads = {"dq": dq, "dk": dk, "dv": dv}
        if case.bias is not None:
            grads["dbias"] = r(reduce_to_shape(ds, np.shape(case.bias)).astype(f32))
    result = {name: g.astype(np.float64) for name, g in grads.items()}
    case._cache[key] = result
    return result
