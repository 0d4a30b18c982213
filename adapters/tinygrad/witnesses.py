"""Witness cases for adapters/tinygrad/divergences.toml (the lead imports this module).

Measured with tinygrad 0.14.0, CPU device, clang renderer (Debian clang 14.0.6).
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case

from attnconf.conformance.engine.witnesses import witness


@witness
def float16_scaled_logit_overflow() -> Case:
    """float16, Dk = 16, default scale 1/4: row 0's logit for key 0 is 16 * 130^2 / 4 = 67600, above
    float16's range, while every input (130) and every other logit is an ordinary float16 value.
    Measured: row 0 of the output is NaN; rows 1 and 2 match the reference (max error 3.4e-4)."""
    rng = np.random.default_rng(21)
    q = rng.normal(size=(1, 1, 3, 16))
    k = rng.normal(size=(1, 1, 5, 16))
    v = rng.normal(size=(1, 1, 5, 16))
    q[0, 0, 0, :] = 130.0
    k[0, 0, 0, :] = 130.0
    return Case.build(q, k, v, dtype="float16")


@witness
def single_key_hidden_row() -> Case:
    """Lk = 1, float64: the mask hides the only key from row 1 of 2 (row 0 sees it)."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 1, 2, 8)), rng.normal(size=(1, 1, 1, 8)), rng.normal(size=(1, 1, 1, 8))
    mask = np.array([True, False]).reshape(1, 1, 2, 1)
    return Case.build(q, k, v, mask=mask, grad_out=rng.normal(size=(1, 1, 2, 8)), dtype="float64")


@witness
def fully_masked_row_dropout() -> Case:
    """fully_masked_row (row 1 of 4 sees none of its 6 keys) with dropout_p = 0.5 and seed 3."""
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(1, 1, 4, 8)), rng.normal(size=(1, 1, 6, 8)), rng.normal(size=(1, 1, 6, 8))
    mask = np.ones((1, 1, 4, 6), dtype=bool)
    mask[..., 1, :] = False
    return Case.build(q, k, v, mask=mask, dropout_p=0.5, seed=3, dtype="float32")
