"""The analytic float64 backward of the oracle (ATTN-GRAD-1, ATTN-GRAD-2, ATTN-EMPTY-3).

Gradients of sum(dO * out) with respect to Q, K, V and the bias, derived from the
oracle's own weights so that forward and backward share one definition:

    dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
    dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO,  dBias = dS.

Only visible (query, key) pairs contribute, so a fully-masked row gives dQ = 0 and
adds nothing to dK, dV or dBias, and masked positions holding huge values or NaN
cannot leak into a gradient. For GQA, dK and dV are summed over the query heads
of each group; dBias is summed over the axes the bias was broadcast along.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .attention import case_params, expand_kv, forward, oracle
from .case import Case


class Grads(NamedTuple):
    dq: np.ndarray            # (B, Hq, Lq, Dk)
    dk: np.ndarray            # (B, Hkv, Lk, Dk)
    dv: np.ndarray            # (B, Hkv, Lk, Dv)
    dbias: np.ndarray | None  # the bias's own shape, None without a bias
    dsinks: np.ndarray | None = None  # (Hq,), None without sinks (ATTN-SINK-4)


def _pair_matmul(coef: np.ndarray, x: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """sum_j coef[..., i, j] x[..., j, :] over visible pairs only.

    coef is (..., I, J) and zero where invisible; x is (..., J, D). Non-finite x rows
    are excluded from the fast product and re-added explicitly only for the output
    rows that see them, so 0 * NaN at an invisible pair never contaminates a row.
    """
    bad = ~np.isfinite(x)
    if not bad.any():
        return np.matmul(coef, x)
    out = np.matmul(coef, np.where(bad, 0.0, x))
    hit = np.matmul(vis.astype(np.float64), bad.any(axis=-1, keepdims=True).astype(np.float64))[..., 0] > 0
    for idx in zip(*np.nonzero(hit)):
        cols = vis[idx]
        out[idx] = (coef[idx][cols, None] * x[idx[:-1]][cols]).sum(axis=0)
    return out


def group_sum(x: np.ndarray, hkv: int) -> np.ndarray:
    """(B, Hq, L, D) -> (B, Hkv, L, D): sum the query heads of each GQA group."""
    B, Hq = x.shape[:2]
    return x.reshape(B, hkv, Hq // hkv, *x.shape[2:]).sum(axis=2)


def reduce_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum x over the axes along which an array of `shape` was broadcast to x.shape."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


def backward_arrays(q, k, v, dout, *, mask=None, bias=None, causal=None, scale=None,
                    q_lengths=None, kv_lengths=None, fwd=None, softcap=None,
                    dropout: tuple[np.ndarray, float] | None = None, **variants) -> Grads:
    """Gradients of sum(dout * attention(q, k, v, ...)) in float64.

    `fwd` may pass an already computed `forward(...)` of the same inputs. `variants` are the other
    keywords of `forward` (window, alibi_slopes, sinks, ...): they change P, which `fwd` carries,
    not the formulas. A softcap multiplies dS by its derivative 1 - tanh^2(x / c) before it reaches
    Q and K (the bias and ALiBi are added after the cap, so dBias is dS itself; ATTN-CAP-3).

    A sink (ATTN-SINK-4) changes P (its rows sum to 1 - P_sink) but not the formulas: O is still
    sum_j P[i,j] V[j], so dS = P (dP - D) with D = rowsum(dO * O). The sink's own gradient is
    dsink[h] = -sum over (b, i) of P_sink[b,h,i] * D[b,h,i], with P_sink = exp(sink - lse): the
    convention of flash-attention 4's `learnable_sink` (flash_attn/cute/flash_bwd_postprocess.py).

    `dropout=(keep, p)` differentiates the dropped forward O = (keep * P / (1 - p)) V for that very
    keep mask (ATTN-DROP-3): dV = (keep * P / (1 - p))^T dO, and dP reaches S only through the kept
    entries, dS = P (keep * dO V^T / (1 - p) - D) with D = rowsum(dO * O) of the dropped O.
    """
    q, k, v, dout = (np.asarray(a, dtype=np.float64) for a in (q, k, v, dout))
    Hq, Hkv = q.shape[1], k.shape[1]
    s = 1.0 / np.sqrt(q.shape[3]) if scale is None else float(scale)
    if fwd is None:
        fwd = forward(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale,
                      q_lengths=q_lengths, kv_lengths=kv_lengths, softcap=softcap, **variants)
    p, vis = fwd.weights, fwd.visible
    ke, ve = expand_kv(k, Hq), expand_kv(v, Hq)
    kept = 1.0 if dropout is None else np.where(dropout[0], 1.0 / (1.0 - dropout[1]), 0.0)
    with np.errstate(all="ignore"):
        # dP matters only at visible pairs: compute it with non-finite V rows zeroed, then
        # mark the columns of non-finite V rows NaN (a visible one makes the gradient undefined).
        vbad = ~np.isfinite(ve)
        dp = np.matmul(dout, np.swapaxes(np.where(vbad, 0.0, ve), -1, -2))
        if vbad.any():
            dp = np.where(vbad.any(axis=-1)[..., None, :], np.nan, dp)
        out = fwd.out
        if dropout is not None:
            dp = dp * kept
            out = _pair_matmul(p * kept, np.where(vbad, 0.0, ve), vis)
        d = (dout * out).sum(axis=-1, keepdims=True)
        ds = np.where(vis, p * (dp - d), 0.0)
        dx = ds
        if softcap is not None:
            raw = s * np.einsum("bhid,bhjd->bhij", q, ke, optimize=True)
            dx = np.where(vis, ds * (1.0 - np.tanh(raw / softcap) ** 2), 0.0)
        dq = s * _pair_matmul(dx, ke, vis)
        dk_full = s * _pair_matmul(np.swapaxes(dx, -1, -2), q, np.swapaxes(vis, -1, -2))
        dv_full = _pair_matmul(np.swapaxes(p * kept, -1, -2), dout, np.swapaxes(vis, -1, -2))
    dbias = None if bias is None else reduce_to_shape(ds, np.shape(bias))
    dsinks = None
    sinks = variants.get("sinks")
    if sinks is not None:
        with np.errstate(all="ignore"):
            p_sink = np.exp(np.asarray(sinks, dtype=np.float64)[None, :, None] - fwd.lse)   # (B, Hq, Lq)
        dsinks = -(p_sink * d[..., 0]).sum(axis=(0, 2))
    return Grads(dq, group_sum(dk_full, Hkv), group_sum(dv_full, Hkv), dbias, dsinks)


def backward(case: Case) -> Grads:
    """The reference gradients for a Case, using `case.grad_out` as dO; cached on the case."""
    cached = case._cache.get("backward")
    if cached is not None:
        return cached
    if case.grad_out is None:
        raise ValueError("the case has no grad_out; build it with grad_out=... to get gradients")
    cached = case._cache["backward"] = backward_arrays(
        case.q, case.k, case.v, case.grad_out, fwd=oracle(case), **case_params(case))
    return cached
