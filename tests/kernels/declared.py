"""Kernels that document a behaviour or a limit, declared in their `attnconf_capabilities` (adapters/contract.py).

Each correct one is the control of a declaration: the declaration alone must make it CONFORMANT or
CONFORMANT_WITH_DIVERGENCES. Each `*_bug` one keeps the declared behaviour and adds one real defect,
which the suite must still catch (NONCONFORMANT, on the bug's clause).
All follow the torch SDPA convention; the stages are those of tests.kernels.correct.
"""
from __future__ import annotations

import math

import torch

from tests.kernels import correct as c

NO_DROPOUT = ["mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths", "gqa",
              "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "noncontiguous", "broadcast_kv"]


def _nan_softmax(s, vis):
    """The textbook softmax over visible keys: a row that sees no key is 0/0 = NaN."""
    s = torch.where(vis, s, -math.inf)
    return torch.softmax(s, dim=-1)


def empty_rows_nan(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct, except that it documents NaN on rows that see no key (and NaN gradients through them)."""
    q, k, v = c.inputs(query, key, value, enable_gqa)
    s, vis = c.apply_masks(c.logits(q, k, scale), attn_mask, is_causal)
    return c.weighted_values(_nan_softmax(s, vis), v).to(query.dtype)


empty_rows_nan.attnconf_capabilities = {"features": NO_DROPOUT, "grads": True, "dropout": False, "empty_rows": "nan"}


def empty_rows_nan_scale_bug(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False):
    """NaN empty rows as documented, and a real bug: a given scale of 0 is replaced by 1/sqrt(d)."""
    return empty_rows_nan(query, key, value, attn_mask, dropout_p, is_causal, scale or None, enable_gqa)


empty_rows_nan_scale_bug.attnconf_capabilities = dict(empty_rows_nan.attnconf_capabilities)


def empty_rows_nan_undeclared(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                              enable_gqa=False):
    return empty_rows_nan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


empty_rows_nan_undeclared.attnconf_capabilities = {"features": NO_DROPOUT, "grads": True, "dropout": False}


def computes_bfloat16(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                      enable_gqa=False):
    """Correct, computed in bfloat16 whatever the input dtype (inputs, logits, softmax and P V)."""
    q, k, v = (x.to(torch.bfloat16) for x in c.inputs(query, key, value, enable_gqa))
    s, vis = c.apply_masks(c.logits(q, k, scale), attn_mask, is_causal)
    return c.weighted_values(c.softmax(s, vis), v).to(query.dtype)


computes_bfloat16.attnconf_capabilities = {"dtypes": ["float32", "bfloat16"], "features": NO_DROPOUT, "grads": False,
                                           "dropout": False, "compute_dtype": "bfloat16"}


def multiple_of_16(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct, for Lq and Lk multiples of 16 only (a ValueError otherwise, as documented); causal only with
    Lq == Lk."""
    lq, lk = query.shape[-2], key.shape[-2]
    if lq % 16 or lk % 16:
        raise ValueError(f"sequence lengths must be multiples of 16; got {lq}, {lk}")
    if is_causal and lq != lk:
        raise ValueError("causal attention needs len_q == len_k")
    return c.naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


multiple_of_16.attnconf_capabilities = {"features": NO_DROPOUT, "grads": False, "dropout": False,
                                        "seqlen_multiple": 16, "causal_equal_lengths": True,
                                        "unsupported_raises": ["ValueError"]}


BLOCK = 64


def noncausal_q128_padded_keys_bug(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                   enable_gqa=False):
    """Takes non-causal calls only with Lq a multiple of 128 (documented; NotImplementedError otherwise) and
    has the bug the issue found: it pads K and V with zeros up to a multiple of 64 keys and attends to the
    padding (a zero key has logit 0, so it takes weight and pulls the output towards 0)."""
    lq, lk = query.shape[-2], key.shape[-2]
    if not is_causal and lq % 128:
        raise NotImplementedError(f"non-causal attention needs len_q % 128 == 0; got {lq}")
    if attn_mask is not None or is_causal or lk % BLOCK == 0:
        return c.naive(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    pad = BLOCK - lk % BLOCK
    zeros = lambda x: torch.cat([x, x.new_zeros((*x.shape[:-2], pad, x.shape[-1]))], dim=-2)  # noqa: E731
    return c.naive(query, zeros(key), zeros(value), None, dropout_p, False, scale, enable_gqa)


noncausal_q128_padded_keys_bug.attnconf_capabilities = {
    "dtypes": ["float32"], "features": ["causal_top_left", "gqa", "custom_scale", "cross", "mask"], "grads": False,
    "dropout": False, "when": [{"causal": False, "seqlen_multiple": {"q": 128}}]}


def _kvcache():
    from tests.kernels.flash import make_flash_attn_with_kvcache

    return make_flash_attn_with_kvcache()


def kvcache_without_batch_idx(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                              cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                              softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """A correct flash_attn_with_kvcache that does not take `cache_batch_idx` (NotImplementedError), undeclared:
    the refused representation is unsupported for those cases, never an ATTN-SCOPE-1 failure of a feature."""
    if cache_batch_idx is not None:
        raise NotImplementedError("cache_batch_idx is not supported")
    return _kvcache()(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, None, cache_leftpad,
                      block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes,
                      num_splits, return_softmax_lse)
