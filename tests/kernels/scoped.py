"""Small kernels with declared scopes, for tests/test_declared_scope.py (torch, SDPA and flash_attn conventions)."""
from __future__ import annotations

import torch

from .correct import naive
from .flash import flash_attn_func


def sdpa_half(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA convention, float16/bfloat16, forward only, no masks but causal top-left."""
    with torch.no_grad():
        return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


sdpa_half.attnconf_capabilities = {"dtypes": ["float16", "bfloat16"], "grads": False, "dropout": False,
                                   "features": ["causal_top_left", "gqa", "custom_scale", "cross"],
                                   "head_dims": [8, 16, 64], "max_seqlen": 64}


def sdpa_no_masks(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA convention; raises NotImplementedError for any attn_mask (undeclared: the full scope)."""
    if attn_mask is not None:
        raise NotImplementedError("masks are not implemented")
    return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def unknown_key(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


unknown_key.attnconf_capabilities = {"dtypes": ["float32"], "backward": False}


def unknown_feature(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


unknown_feature.attnconf_capabilities = {"features": ["mask", "causal_magic"]}


def flash_with_mask(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


flash_with_mask.attnconf_capabilities = {"features": ["mask", "causal_bottom_right"]}


def flash_windows_only(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                       alibi_slopes=None, deterministic=False, return_attn_probs=False):
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


flash_windows_only.attnconf_capabilities = {"dtypes": ["float32"], "features": ["window_bottom_right", "cross"],
                                            "head_dims": {"max": 32}}


def flash_positional_only(query, key, value):
    return flash_attn_func(query, key, value)
