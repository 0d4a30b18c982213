"""The inputs of an approximate kernel, quantized exactly as its contract declares (SPEC section 29).

A quantized kernel does not compute softmax(Q K^T s) V on the case's inputs: it computes it on
quantized ones. The reference of such a kernel is the float64 attention of the *dequantized*
values, which this module produces; the tolerance model then judges the kernel against that
problem exactly as it judges any kernel (the naive baseline of the dequantized case at the case's
dtype), so the only error a contract excuses is the quantization it declares.

Schemes:

- ``int8_per_block`` (SageAttention's Triton path, thu-ml/SageAttention `quant_per_block.py`):
  optionally K minus its mean over the sequence (smooth-K, in the input dtype), then per (batch,
  head, block of `q_block` queries or `k_block` keys) x * pre / scale rounded half away from zero
  to int8, with scale = max |x * pre| / 127 in float32; Q's `pre` is float32(scale * 1.44269504)
  (the kernel works in base 2), K's is 1. The logits are q_int8 . k_int8 * scale_q * scale_k in
  base 2, i.e. that times ln 2 in natural units, which the returned Q carries. With `pv = "float16"`
  V is rounded to float16 as the kernel converts it (a bfloat16 value beyond 65504 becomes inf: the
  reference of such a row is not finite, and the row lies outside the scheme's range).
- ``fp8_e4m3_per_head`` (flash-attention 3's FP8 path): per (batch, KV head) a float32 descale
  factor amax / 448 for each of Q (over the query heads of the group), K and V; the kernel gets
  e4m3 values x / descale (round to nearest even) and the descale factors, shape (B, Hkv).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .case import Case
from .emulate import _rounder

LOG2E_F32 = 1.44269504                  # the constant SageAttention multiplies sm_scale by
E4M3_MAX = 448.0
SCHEMES = ("int8_per_block", "fp8_e4m3_per_head")


def int8_per_block(x: np.ndarray, block: int, pre: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values as float64, float32 scale per element's block broadcast to x) of x (B, H, L, D),
    blocks of `block` rows along L, all arithmetic in float32 as the Triton kernel does it."""
    f32 = np.float32
    xs = x.astype(f32) * f32(pre)
    B, H, L, D = x.shape
    nb = -(-L // block)
    pad = np.zeros((B, H, nb * block, D), dtype=f32)
    pad[:, :, :L] = xs
    blocks = pad.reshape(B, H, nb, block, D)
    scale = (np.abs(blocks).max(axis=(3, 4), keepdims=True) / f32(127.0)).astype(f32)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = (blocks / np.where(scale > 0, scale, f32(1.0))).astype(f32)
        y = (y + f32(0.5) * np.where(y >= 0, f32(1.0), f32(-1.0))).astype(f32)
    ints = np.trunc(y).astype(np.float64).reshape(B, H, nb * block, D)[:, :, :L]
    sc = np.broadcast_to(scale, blocks.shape).reshape(B, H, nb * block, D)[:, :, :L].astype(np.float64)
    return ints, sc


def smooth(k: np.ndarray, dtype: str) -> np.ndarray:
    """K minus its mean over the sequence, both rounded to `dtype` as torch computes k - k.mean(seq)."""
    r = _rounder(dtype)
    mean = r(np.asarray(k.astype(np.float32).mean(axis=2, keepdims=True), dtype=np.float64))
    return r(k - mean).astype(np.float64)


def sage_inputs(case: Case, *, q_block: int = 128, k_block: int = 64, smooth_k: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(Q, K) whose float64 attention at the case's scale is the int8_per_block kernel's logits."""
    s = case.effective_scale
    qi, qs = int8_per_block(case.q, q_block, float(np.float32(s * LOG2E_F32)))
    k = smooth(case.k, case.dtype) if smooth_k else case.k
    ki, ks = int8_per_block(k, k_block)
    if s == 0:                                   # every logit is 0 whatever Q holds
        return np.zeros_like(case.q), ki * ks
    return qi * qs * np.log(2.0) / s, ki * ks


def fp8_per_head(x: np.ndarray, hkv: int) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 values as float64, float32 descale (B, Hkv)) of x (B, H, L, D): one factor per batch element
    and KV head, over the H // Hkv heads of its group."""
    import ml_dtypes

    B, H, L, D = x.shape
    g = x.reshape(B, hkv, (H // hkv) * L * D)
    amax = np.abs(g).max(axis=-1) if g.shape[-1] else np.zeros((B, hkv))
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    per_head = np.repeat(descale.astype(np.float64), H // hkv, axis=1)[:, :, None, None]
    vals = (x / per_head).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return vals, descale


def fp8_inputs(case: Case) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"q"|"k"|"v": (e4m3 values, descale (B, Hkv))} for the fp8_e4m3_per_head scheme."""
    hkv = case.shape["Hkv"]
    return {n: fp8_per_head(getattr(case, n), hkv) for n in ("q", "k", "v")}


def quantized_case(case: Case, scheme: dict[str, Any]) -> Case:
    """The case whose float64 reference is the declared quantized computation (inputs not re-rounded)."""
    name = scheme["scheme"]
    if name == "int8_per_block":
        q, k = sage_inputs(case, q_block=int(scheme.get("q_block", 128)), k_block=int(scheme.get("k_block", 64)),
                           smooth_k=bool(scheme.get("smooth_k", True)))
        changes = {"q": q, "k": k}
        if scheme.get("pv", "float16") == "float16":    # V as the kernel multiplies it: float16, inf beyond 65504
            with np.errstate(over="ignore"):
                changes["v"] = case.v.astype(np.float16).astype(np.float64)
    elif name == "fp8_e4m3_per_head":
        hq, hkv = case.shape["Hq"], case.shape["Hkv"]
        changes = {}
        for n, (vals, d) in fp8_inputs(case).items():
            heads = hq if n == "q" else hkv
            changes[n] = vals * np.repeat(d.astype(np.float64), heads // hkv, axis=1)[:, :, None, None]
    else:
        raise ValueError(f"unknown quantization scheme {name!r}; known: {', '.join(SCHEMES)}")
    return dataclasses.replace(case, _cache={}, **changes)
