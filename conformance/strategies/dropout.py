"""Dropout cases: one-hot V, so that each output entry is one dropped-or-kept weight."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attnconf.conformance.strategies.cells import allows, dtype_choice
from attnconf.reference import DTYPES, Case


# No p = 0.5 among the dropout probabilities: there 1/p == 1/(1-p), and a kernel rescaling by 1/p would pass.
DROPOUT_PROBABILITIES = (0.1, 0.3, 0.7)


def _moderate_logits_one_hot_v(rng: np.random.Generator, b: int, hq: int, hkv: int, lq: int, lk: int, d: int):
    """q and k of entries N(0, 1/4) (logits of order one: no weight near 0) and V = the identity over the keys."""
    q = 0.5 * rng.normal(size=(b, hq, lq, d))
    k = 0.5 * rng.normal(size=(b, hkv, lk, d))
    return q, k, np.broadcast_to(np.eye(lk), (b, hkv, lk, lk)).copy()


@st.composite
def dropout_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                  probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """One-hot V (Dv = Lk <= 16, V[j] = e_j), so each output entry is one dropped-or-kept weight;
    moderate logits (no weight near 0), no empty rows, at least 64 entries per call."""
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    lq, lk = draw(st.sampled_from((4, 8, 16))), draw(st.sampled_from((4, 8, 16)))
    while b * hq * lq * lk < 64:
        hq *= 2
    d = draw(st.sampled_from((4, 8, 16)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    q, k, v = _moderate_logits_one_hot_v(np.random.default_rng(seed), b, hq, hq, lq, lk, d)
    return Case.build(q, k, v, dtype=dtype, seed=seed, causal=draw(st.sampled_from((None, "top_left"))),
                      dropout_p=draw(st.sampled_from(probabilities)))


@st.composite
def dropout_cooccurrence_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                               probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """Q = K = 0 (every weight 1/L) and one-hot V (Dk = Dv = Lq = Lk = L, V[j] = e_j), B = 2, H even, no
    mask: each output entry is 0 (dropped) or 1/(L (1 - p)) (kept), so the keep mask of every batch
    element, head, query row and key is read off the output, and each pairs with a neighbour along
    every axis."""
    h = draw(st.sampled_from((2, 4)))
    n = draw(st.sampled_from((16, 32)))        # at least 512 pairs per call and axis: a few calls suffice
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    q, k = np.zeros((2, h, n, n)), np.zeros((2, h, n, n))
    v = np.broadcast_to(np.eye(n), (2, h, n, n)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, dropout_p=draw(st.sampled_from(probabilities)))


@st.composite
def dropout_grad_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                       probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """One-hot V (Dk = Dv = Lk, V[j] = e_j) with moderate logits, as `dropout_cases`, grouped key/value
    heads where the implementation takes them, and an upstream gradient dO of standard normal entries."""
    b, hkv = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    hq = hkv * (draw(st.sampled_from((1, 2))) if allows("gqa") else 1)
    lq, lk = draw(st.sampled_from((4, 8, 16))), draw(st.sampled_from((4, 8, 16)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    q, k, v = _moderate_logits_one_hot_v(rng, b, hq, hkv, lq, lk, lk)
    return Case.build(q, k, v, dtype=dtype, seed=seed, grad_out=rng.normal(size=(b, hq, lq, lk)),
                      causal=draw(st.sampled_from((None, "top_left"))), dropout_p=draw(st.sampled_from(probabilities)))
