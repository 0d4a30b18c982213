"""Witness cases: for each divergence entry, a small fixed case that must still show it.

A witness that stops diverging fails the run (conformance/test_divergences.py),
so an entry that no longer applies is noticed and removed. Register with
@witness; the function name is the name divergence files use.
"""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from attnconf.reference import Case

WITNESSES: dict[str, Callable[[], Case]] = {}


def witness(fn: Callable[[], Case]) -> Callable[[], Case]:
    WITNESSES[fn.__name__] = fn
    return fn


def _qkv(rng: np.random.Generator, b=1, h=1, lq=4, lk=6, d=8):
    return rng.normal(size=(b, h, lq, d)), rng.normal(size=(b, h, lk, d)), rng.normal(size=(b, h, lk, d))


@witness
def fully_masked_row() -> Case:
    """Row 1 of 4 sees no key; every other row sees some."""
    q, k, v = _qkv(np.random.default_rng(1))
    mask = np.ones((1, 1, 4, 6), dtype=bool)
    mask[..., 1, :] = False
    return Case.build(q, k, v, mask=mask, dtype="float32")


@witness
def bias_emptied_row() -> Case:
    """Row 2 of 4 has a -inf bias on every key (nothing else hides a key)."""
    q, k, v = _qkv(np.random.default_rng(14))
    bias = np.zeros((1, 1, 4, 6))
    bias[..., 2, :] = -np.inf
    return Case.build(q, k, v, bias=bias, dtype="float32")


@witness
def kv_length_mismatch() -> Case:
    """K has 5 rows and V 6: invalid, must raise. Built unvalidated on purpose."""
    rng = np.random.default_rng(4)
    return Case(rng.normal(size=(1, 2, 4, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 6, 8)),
                dtype="float32")


@witness
def rank1_mask() -> Case:
    """A (Lk,) mask hiding the last key, broadcast over everything else."""
    q, k, v = _qkv(np.random.default_rng(5), h=2)
    return Case.build(q, k, v, mask=np.arange(6) != 5, dtype="float32")


@witness
def masked_huge_logit_half() -> Case:
    """float16; key 0 is hidden by the mask but its scaled logit is about 6e4, far above the visible ones."""
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, lq=2, lk=4)
    q[..., 0], k[..., 0, :] = 300.0, 0.0
    k[..., 0, 0] = 566.0
    mask = np.ones((1, 1, 2, 4), dtype=bool)
    mask[..., 0] = False
    return Case.build(q, k, v, mask=mask, dtype="float16")


@witness
def negative_scale_causal() -> Case:
    """scale = -0.35 with top-left causal masking: an ordinary, finite problem."""
    q, k, v = _qkv(np.random.default_rng(8), lq=3, lk=3)
    return Case.build(q, k, v, causal="top_left", scale=-0.35, dtype="float32")


@witness
def bfloat16_grad_one_by_one() -> Case:
    """bfloat16, one query and one key, with an output gradient."""
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, lq=1, lk=1)
    return Case.build(q, k, v, grad_out=rng.normal(size=(1, 1, 1, 8)), dtype="bfloat16")


@witness
def float16_lse_beyond_range() -> Case:
    """float16, one key per row with a scaled logit of 7e4: the lse (7e4) is beyond float16's range."""
    q = np.full((1, 1, 2, 8), 100.0)
    k = np.full((1, 1, 1, 8), 87.5)
    v = np.ones((1, 1, 1, 8))
    return Case.build(q, k, v, scale=1.0, dtype="float16")


@witness
def float64_precision() -> Case:
    """Ordinary float64 inputs: float32-accurate arithmetic misses the float64 bound by far."""
    q, k, v = _qkv(np.random.default_rng(2), lq=8, lk=8)
    return Case.build(q, k, v, dtype="float64")


@witness
def padded_query_row() -> Case:
    """Query lengths [2]: rows 2 and 3 are padding and must output 0."""
    q, k, v = _qkv(np.random.default_rng(3))
    return Case.build(q, k, v, q_lengths=[2], dtype="float32")


# ---- appended for the tensorflow backend (adapters/tensorflow/adapter.py) ----------
@witness
def multi_query_heads() -> Case:
    """Four query heads sharing one KV head (MQA)."""
    rng = np.random.default_rng(11)
    q, k, v = rng.normal(size=(1, 4, 4, 8)), rng.normal(size=(1, 1, 6, 8)), rng.normal(size=(1, 1, 6, 8))
    return Case.build(q, k, v, dtype="float32")


@witness
def float16_logit_overflow() -> Case:
    """float16, Dk=64: q.k reaches 1.0e5 (> 65504) while the scaled logits stay near 1.3e4."""
    rng = np.random.default_rng(12)
    q = np.full((1, 1, 2, 64), 40.0)
    k = np.concatenate([np.full((1, 1, 1, 64), 40.0), rng.normal(size=(1, 1, 3, 64))], axis=2)
    v = rng.normal(size=(1, 1, 4, 64))
    return Case.build(q, k, v, dtype="float16")


@witness
def float16_visible_logits_negative_overflow() -> Case:
    """float16: row 0 sees only key 0, whose q.k is -90000 (below -65504); key 1 is masked. Row 1
    sees both keys with moderate logits. The values of key 1 lie far from those of key 0, farther
    than the allowance of a naive baseline that forms q.k in float16 before scaling (its row 0 is empty)."""
    q = np.array([[[[150.0] * 4, [0.5, -0.25, 0.75, 0.1]]]])
    k = np.array([[[[-150.0] * 4, [0.3, 0.2, -0.4, 0.9]]]])
    v = np.array([[[[0.125, -0.25, 0.0625, 0.375], [-1.5, 2.25, 2.0, -3.0]]]])
    mask = np.array([[[[True, False], [True, True]]]])
    return Case.build(q, k, v, mask=mask, dtype="float16")


@witness
def half_long_accumulation() -> Case:
    """bfloat16 with Dk = Lk = 256: long dot products expose how the matmuls accumulate."""
    rng = np.random.default_rng(13)
    q, k, v = rng.normal(size=(1, 2, 16, 256)), rng.normal(size=(1, 2, 256, 256)), rng.normal(size=(1, 2, 256, 256))
    return Case.build(q, k, v, dtype="bfloat16")


@witness
def half_long_accumulation_f16() -> Case:
    """half_long_accumulation in float16 (values scaled so that products stay in float16's range)."""
    rng = np.random.default_rng(13)
    q, k, v = rng.normal(size=(1, 2, 16, 256)), rng.normal(size=(1, 2, 256, 256)), rng.normal(size=(1, 2, 256, 256))
    return Case.build(q, k, v, dtype="float16")


@witness
def half_accumulation_layer():
    """A bfloat16 layer, E = 128 in two heads, 8 queries on 16 keys: its 128-long projections expose how
    the layer's einsums accumulate (found by search over seeds: both Keras paths at 4.9x the baseline)."""
    from attnconf.reference.layer import random_layer_case

    return random_layer_case(np.random.default_rng(3), 1, 8, 16, 128, 2, dtype="bfloat16", biases=False)


# ---- appended for the torch backend (adapters/torch/adapter.py) ---------------------
@witness
def fully_masked_row_half() -> Case:
    """fully_masked_row in float16, for kernels that run only half precision (cuDNN, flash on CUDA)."""
    q, k, v = _qkv(np.random.default_rng(1))
    mask = np.ones((1, 1, 4, 6), dtype=bool)
    mask[..., 1, :] = False
    return Case.build(q, k, v, mask=mask, dtype="float16")


# ---- appended for adapters/jax/divergences.toml (jax:cudnn runs only float16/bfloat16) ----
@witness
def fully_masked_row_bfloat16() -> Case:
    """fully_masked_row in bfloat16, head dim 8: runnable by cuDNN."""
    q, k, v = _qkv(np.random.default_rng(1))
    mask = np.ones((1, 1, 4, 6), dtype=bool)
    mask[..., 1, :] = False
    return Case.build(q, k, v, mask=mask, dtype="bfloat16")


@witness
def zero_scale_half() -> Case:
    """scale = 0 in float16: every logit is 0, the weights are uniform and each row is the mean of V.
    Head dim 64 so that every CUDA kernel accepts it."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 64)) for n in (3, 6, 6))
    return Case.build(q, k, v, scale=0.0, dtype="float16")


def load_all() -> None:
    """Import every registered backend pack's `witnesses` module (their @witness functions register)."""
    from attnconf.adapters.registry import pack_modules

    for name in pack_modules("witnesses"):
        importlib.import_module(name)
