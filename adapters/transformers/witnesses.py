"""Witness cases of adapters/transformers/divergences.toml (transformers 5.23.0, torch 2.13.0, CPU).

Each is the situation the divergence happens in under real use: a left-padded batch with causal masking,
the way `generate` pads prompts (rows of padding tokens see no key), reached through transformers' own
mask functions (`create_causal_mask` with a 2D attention_mask).
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance.engine.witnesses import witness
from attnconf.reference import Case


def _left_padded(dtype: str, *, seed: int = 21, bias: bool = False, mag: float = 1.0, sinks: bool = False) -> Case:
    """B=2, Hq=2, Hkv=1, L=6, D=8, top-left causal; batch 0 is left-padded by 2 tokens, so its rows 0
    and 1 see no key (every key they could see is padding); batch 1 is not padded."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, 2, 6, 8)) * mag
    k = rng.normal(size=(2, 1, 6, 8)) * mag
    v = rng.normal(size=(2, 1, 6, 8))
    keep = np.ones((2, 1, 1, 6), dtype=bool)
    keep[0, ..., :2] = False
    kw = {}
    if bias:
        kw["bias"] = rng.normal(size=(1, 2, 6, 6))
    if sinks:
        kw["sinks"] = np.array([0.5, -1.0])
    return Case.build(q, k, v, mask=keep, causal="top_left", dtype=dtype, grad_out=rng.normal(size=(2, 2, 6, 8)),
                      **kw)


@witness
def hf_left_padded_f32() -> Case:
    """float32: the eager functions give rows 0-1 of batch 0 the mean of V over the 2 padded keys."""
    return _left_padded("float32")


@witness
def hf_left_padded_bf16() -> Case:
    """bfloat16: as float32 (finfo(bfloat16).min absorbs every logit)."""
    return _left_padded("bfloat16")


@witness
def hf_left_padded_f16_large_logits() -> Case:
    """float16 with logits of order 10: -65504 + logit rounds to buckets 32 apart (measured: not the mean)."""
    return _left_padded("float16", seed=23, mag=3.0)


@witness
def hf_min_mask_beaten_f16() -> Case:
    """float16, scale 1, Dk = 2: row 0's visible keys have logits -20000 and -30000, its mask-hidden key 50000;
    -65504 + 50000 = -15504 beats both, so the row puts its weight on the hidden key. Row 1 is ordinary."""
    q = np.array([[[[100.0, 0.0], [1.0, 0.5]]]])
    k = np.array([[[[-200.0, 0.0], [-300.0, 0.0], [500.0, 0.0]]]])
    v = np.array([[[[1.0, 2.0], [3.0, -1.0], [-2.0, 0.5]]]])
    keep = np.array([True, True, False])[None, None, None, :]
    return Case.build(q, k, v, mask=keep, scale=1.0, dtype="float16",
                      grad_out=np.array([[[[0.5, -1.0], [1.0, 0.25]]]]))


@witness
def hf_left_padded_f64() -> Case:
    """float64: finfo(float64).min becomes -inf in the eager functions' float32 softmax: NaN."""
    return _left_padded("float64")


@witness
def hf_left_padded_bias_f32() -> Case:
    """float32 with a bias: sdpa merges it as where(mask, bias, finfo.min): the padded rows are uniform."""
    return _left_padded("float32", bias=True)


@witness
def hf_left_padded_bias_f16() -> Case:
    """float16 with a bias: sdpa's padded rows are the softmax of their own logits over the padded keys."""
    return _left_padded("float16", bias=True, seed=24)


@witness
def hf_neg_inf_bias_row() -> Case:
    """float32, no boolean mask: row 1's bias is -inf at every key, so no key is hidden by anything
    but the bias (custom 4D mask). The eager functions' plain softmax gives NaN there."""
    rng = np.random.default_rng(25)
    q, k, v = rng.normal(size=(1, 2, 4, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 5, 8))
    bias = rng.normal(size=(1, 2, 4, 5))
    bias[:, :, 1, :] = -np.inf
    return Case.build(q, k, v, bias=bias, dtype="float32", grad_out=rng.normal(size=(1, 2, 4, 8)))


@witness
def hf_float64_plain() -> Case:
    """float64, nothing masked: the eager functions' softmax runs in float32 (error ~1e-8, bound ~1e-14)."""
    rng = np.random.default_rng(26)
    q, k, v = rng.normal(size=(1, 2, 8, 16)), rng.normal(size=(1, 2, 8, 16)), rng.normal(size=(1, 2, 8, 16))
    return Case.build(q, k, v, dtype="float64", grad_out=rng.normal(size=(1, 2, 8, 16)))


@witness
def hf_masked_overflow_f16() -> Case:
    """float16, head dim 64: q = 8 everywhere; key 0 (hidden by the mask) is 160 everywhere, so its unscaled
    logit is 81920 (> 65504) and its scaled logit 10240 is representable; the visible keys are ordinary."""
    rng = np.random.default_rng(27)
    q = np.full((1, 1, 2, 64), 8.0)
    k = rng.normal(size=(1, 1, 4, 64))
    k[..., 0, :] = 160.0
    v = rng.normal(size=(1, 1, 4, 8))
    keep = np.array([False, True, True, True])[None, None, None, :]
    return Case.build(q, k, v, mask=keep, dtype="float16")


@witness
def hf_masked_overflow_f16_grads() -> Case:
    """`hf_masked_overflow_f16` with an output gradient: both rows are NaN, so back-propagation carries the NaN
    into dQ of those rows and all of dK and dV (nothing else is left finite to judge)."""
    rng = np.random.default_rng(29)
    return hf_masked_overflow_f16().replace(grad_out=rng.normal(size=(1, 1, 2, 8)))


@witness
def hf_masked_overflow_sinks_f16_grads() -> Case:
    """`hf_masked_overflow_f16_grads` with gpt-oss's sink logit of 0.5."""
    return hf_masked_overflow_f16_grads().replace(sinks=np.array([0.5]))


@witness
def hf_masked_overflow_sinks_f16() -> Case:
    """`hf_masked_overflow_f16` with a sink logit of 0.5 (gpt-oss's eager function always reads one)."""
    return hf_masked_overflow_f16().replace(sinks=np.array([0.5]))


def _sliding_window_one(lq: int, sinks: bool = False) -> Case:
    """float32, Lk = 4, window (0, 0) under bottom-right causal masking: `config.sliding_window = 1`, with the
    first 4 - Lq tokens already in the DynamicCache."""
    rng = np.random.default_rng(28)
    q, k, v = rng.normal(size=(1, 2, lq, 8)), rng.normal(size=(1, 2, 4, 8)), rng.normal(size=(1, 2, 4, 8))
    return Case.build(q, k, v, causal="bottom_right", window=(0, 0), dtype="float32",
                      grad_out=rng.normal(size=(1, 2, lq, 8)), sinks=np.array([0.5, -1.0]) if sinks else None)


@witness
def hf_sliding_window_one_prefill() -> Case:
    """Lq = 2 after 2 cached tokens: the 2-column mask meets 4 keys (RuntimeError)."""
    return _sliding_window_one(2)


@witness
def hf_sliding_window_one_decode() -> Case:
    """Lq = 1 after 3 cached tokens: the 1-column mask broadcasts, the row attends to all 4 keys."""
    return _sliding_window_one(1)


@witness
def hf_sliding_window_one_prefill_sinks() -> Case:
    """hf_sliding_window_one_prefill with sink logits (gpt-oss's eager function)."""
    return _sliding_window_one(2, sinks=True)


@witness
def hf_sliding_window_one_decode_sinks() -> Case:
    """hf_sliding_window_one_decode with sink logits (gpt-oss's eager function)."""
    return _sliding_window_one(1, sinks=True)


@witness
def hf_left_padded_huge_hidden_f32() -> Case:
    """float32 left-padded batch (as hf_left_padded_f32) whose padded keys are ~1e30 (test_masked_positions_
    have_no_effect's fill): logits ~3e31 exceed half the spacing at finfo(float32).min (2^103), so
    logit + finfo.min is not absorbed and the empty rows are not the mean of the padded values."""
    c = _left_padded("float32")
    k = c.k.copy()
    k[0, 0, 0, :] = 1e31 * np.sign(c.q[0, 0, 0, :])     # row 0 of head 0: logit ~ +3e31 at padded key 0
    k[0, 0, 1, :] = 1e29
    v = c.v.copy()
    v[0, :, :2, :] = 1e30
    return c.replace(k=k, v=v)
