"""Kernels that misbehave as a process, not as mathematics: for adapters.isolated.

A third-party kernel can take the test process down (segfault), never return,
eat all memory, or return garbage. Run in-process these would kill or hang the
whole suite; through `adapters.isolated.IsolatedAdapter` each must turn into
one failed test with a one-line reason.

They use only operations NumPy arrays and torch tensors share, so they run
under `--backend=numpy` (whose worker starts in about a second) and
`--backend=torch` alike.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time

import numpy as np

LONG = 64  # segfault_if_long crashes when the key length exceeds this


def segfault(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Kills its own process with SIGSEGV, as a kernel reading a bad pointer would."""
    os.kill(os.getpid(), signal.SIGSEGV)
    ctypes.string_at(0)  # in case the signal is handled: read address 0


def segfault_if_long(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """Segfaults when the key length exceeds LONG, else returns the (unmasked) attention output:
    shows that the worker is replaced and the next call works."""
    if key.shape[-2] > LONG:
        segfault(query, key, value)
    return _plain_attention(query, key, value, scale)


def hang(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Never returns (a deadlocked or spinning kernel)."""
    while True:
        time.sleep(3600)


def hang_if_long_queries(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """Never returns when Lq > 3; otherwise the (unmasked) attention output."""
    if query.shape[-2] > 3:
        hang(query, key, value)
    return _plain_attention(query, key, value, scale)


def alloc_unbounded(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Allocates 64 MiB chunks, touching each, until allocation fails."""
    hoard = []
    while True:
        hoard.append(np.ones(8 * 1024 * 1024, dtype=np.float64))


def returns_nan(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Returns an output of the right shape and dtype, full of NaN."""
    return _plain_attention(query, key, value, scale) * float("nan")


def wrong_shape(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Returns the output with its last query row missing."""
    return _plain_attention(query, key, value, scale)[:, :, :-1]


def mutates_inputs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Computes an output, then scales `query` in place."""
    out = _plain_attention(query, key, value, scale)
    query *= 2.0
    return out


def mutates_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Computes an output, then halves a float `attn_mask` in place (the output itself is not judged here)."""
    out = _plain_attention(query, key, value, scale)
    if attn_mask is not None and attn_mask.dtype != bool:
        attn_mask *= 0.5
    return out


def raises_always(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Raises on every call."""
    raise RuntimeError("hostile kernel refuses to run")


def returns_list(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Returns a nested Python list instead of an array."""
    return _plain_attention(query, key, value, scale).tolist()


def _plain_attention(query, key, value, scale):
    """softmax(q k^T * scale) v with no masks, for NumPy arrays or torch tensors (same Hq and Hkv)."""
    sc = query.shape[-1] ** -0.5 if scale is None else scale
    if isinstance(query, np.ndarray):
        s = (query @ np.swapaxes(key, -1, -2)) * sc
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ value
    import torch  # noqa: PLC0415 (only torch tensors get here)

    return torch.softmax((query @ key.transpose(-2, -1)) * sc, dim=-1) @ value
