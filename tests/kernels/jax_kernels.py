"""Kernels in the `jax.nn.dot_product_attention` convention (`--backend=jax --kernel=...`), for the kernel
adapter's window and gradient tests (adapters/jax/tests/test_adapter_jax.py):

- `attention`: correct per spec/SPEC.md, in plain jax.numpy: BTNH, bool mask (True = attend), additive bias,
  top-left `is_causal`, query/key padding, `local_window_size` as jax defines it (key j is visible to query i
  iff i - left <= j <= i + right, top-left, an int meaning (w, w)), GQA (query head n uses KV head n // G).
  Rows that see no key output 0 (ATTN-EMPTY-1; jax.nn's xla path gives the mean of V there). Differentiable
  with plain autodiff; the softmax is computed in float32 (float64 for float64 inputs). Jitted (the static
  arguments are the scale, is_causal and the window), as kernels usually are.
- `ignores_window`: `attention` that accepts `local_window_size` and drops it (ATTN-ARG-1).
- `wrong_dq`: `attention` with a `jax.custom_vjp` whose dq forgets the softmax scale (dq = dS K, not
  scale * dS K); its forward, dk and dv are right.
- `forward_only`: a correct forward behind `jax.pure_callback` (no derivative), declaring {"grads": False}.
"""
from __future__ import annotations

import functools

import numpy as np

import jax
import jax.numpy as jnp


def _visibility(T: int, S: int, mask, is_causal: bool, q_len, kv_len, window) -> jnp.ndarray:
    """(B or 1, 1 or N, T, S) bool, everything but the bias's -inf entries."""
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    static = np.ones((T, S), dtype=bool)
    if is_causal:
        static &= j <= i
    if window is not None:
        left, right = window
        static &= (i <= j + left) & (i >= j - right)
    vis = jnp.asarray(static)[None, None]
    if mask is not None:
        vis = vis & jnp.asarray(mask, dtype=bool)
    if q_len is not None:
        vis = vis & (jnp.arange(T)[None, None, :, None] < jnp.asarray(q_len)[:, None, None, None])
    if kv_len is not None:
        vis = vis & (jnp.arange(S)[None, None, None, :] < jnp.asarray(kv_len)[:, None, None, None])
    return vis


@functools.partial(jax.jit, static_argnames=("scale", "is_causal", "local_window_size"))
def _attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
               query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None):
    B, T, N, H = query.shape
    S, K = key.shape[1], key.shape[2]
    if N % K:
        raise ValueError(f"{N} query heads are not a multiple of {K} key/value heads")
    acc = jnp.float64 if query.dtype == jnp.float64 else jnp.float32
    q, k, v = (x.astype(acc) for x in (query, key, value))
    if K != N:                                   # query head n reads KV head n // G
        k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
    s = 1.0 / np.sqrt(H) if scale is None else float(scale)
    logits = s * jnp.einsum("btnh,bsnh->bnts", q, k)
    if bias is not None:
        logits = logits + jnp.asarray(bias).astype(acc)
    vis = _visibility(T, S, mask, is_causal, query_seq_lengths, key_value_seq_lengths, local_window_size)
    vis = vis & ~jnp.isneginf(logits)
    m = jnp.max(jnp.where(vis, logits, -jnp.inf), axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.where(vis, jnp.exp(jnp.where(vis, logits, m) - m), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    w = p / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("bnts,bsnh->btnh", w, v).astype(query.dtype)


def _static_window(w):
    """local_window_size as a hashable static argument: None, or (left, right) Python ints."""
    if w is None:
        return None
    return (int(w), int(w)) if np.ndim(w) == 0 else tuple(int(x) for x in w)


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None):
    """Correct: every argument of the convention honoured, differentiable."""
    return _attention(query, key, value, bias, mask, scale=scale, is_causal=bool(is_causal),
                      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                      local_window_size=_static_window(local_window_size))


def ignores_window(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                   query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None):
    """Bug: accepts local_window_size and ignores it."""
    return _attention(query, key, value, bias, mask, scale=scale, is_causal=bool(is_causal),
                      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths)


def wrong_dq(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
             query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None):
    """Bug: a custom VJP whose dq misses the softmax scale (right forward, dk, dv and dbias)."""
    s = 1.0 / np.sqrt(query.shape[-1]) if scale is None else float(scale)
    static = dict(mask=mask, scale=scale, is_causal=bool(is_causal), query_seq_lengths=query_seq_lengths,
                  key_value_seq_lengths=key_value_seq_lengths, local_window_size=_static_window(local_window_size))

    def plain(q, k, v, b):
        return _attention(q, k, v, b, **static)

    @jax.custom_vjp
    def attend(q, k, v, b):
        return plain(q, k, v, b)

    def fwd(q, k, v, b):
        return plain(q, k, v, b), (q, k, v, b)

    def bwd(res, g):
        dq, dk, dv, db = jax.vjp(plain, *res)[1](g)
        return (dq / s).astype(dq.dtype), dk, dv, db

    attend.defvjp(fwd, bwd)
    return attend(query, key, value, bias)


def forward_only(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                 query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None):
    """Correct forward computed outside JAX's tracing (a foreign call, as a compiled kernel would be):
    `jax.pure_callback` has no derivative, so the kernel declares that it has no backward."""
    def host(q, k, v):
        return np.asarray(attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), bias, mask, scale=scale,
                                    is_causal=is_causal, query_seq_lengths=query_seq_lengths,
                                    key_value_seq_lengths=key_value_seq_lengths,
                                    local_window_size=local_window_size))

    shape = jax.ShapeDtypeStruct(query.shape[:3] + value.shape[3:], query.dtype)
    return jax.pure_callback(host, shape, query, key, value)


forward_only.attnconf_capabilities = {"grads": False}
