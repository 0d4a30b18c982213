"""The multi-head attention layer reference (ATTN-MHA-1) against an explicit per-head loop."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from attnconf.reference import CaseError, LayerCase, mha, naive_mha, numpy_dtype, random_layer_case


def loop_mha(lc: LayerCase) -> np.ndarray:
    """The layer written out row by row: per head, per query, a softmax over visible keys."""
    B, Lq, E = lc.x_q.shape
    Lk = lc.x_k.shape[1]
    h, d = lc.num_heads, E // lc.num_heads
    zero = np.zeros(E)
    bq, bk, bv, bo = (zero if b is None else b for b in (lc.b_q, lc.b_k, lc.b_v, lc.b_o))
    out = np.zeros((B, Lq, E))
    for b in range(B):
        concat = np.zeros((Lq, E))
        for head in range(h):
            cols = slice(head * d, (head + 1) * d)
            for i in range(Lq):
                qi = lc.x_q[b, i] @ lc.w_q[:, cols] + bq[cols]
                logits, values = [], []
                for j in range(Lk):
                    if lc.mask is not None and not lc.mask[b, i, j]:
                        continue
                    if lc.causal == "top_left" and j > i:
                        continue
                    kj = lc.x_k[b, j] @ lc.w_k[:, cols] + bk[cols]
                    logits.append(float(qi @ kj) / math.sqrt(d))
                    values.append(lc.x_v[b, j] @ lc.w_v[:, cols] + bv[cols])
                if logits:
                    m = max(logits)
                    w = np.array([math.exp(x - m) for x in logits])
                    concat[i, cols] = (w[:, None] * np.array(values)).sum(axis=0) / w.sum()
        out[b] = concat @ lc.w_o + bo
    return out


@pytest.mark.clauses("ATTN-MHA-1")
@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("mask,causal", [(None, None), ("random", None), (None, "top_left"), ("random", "top_left")])
def test_mha_matches_explicit_loops(biases, mask, causal):
    rng = np.random.default_rng(0)
    lc = random_layer_case(rng, B=2, Lq=5, Lk=5 if causal else 7, E=8, num_heads=2, dtype="float64",
                           biases=biases, mask=mask, causal=causal)
    out = mha(lc)
    assert out.shape == (2, 5, 8)
    np.testing.assert_allclose(out, loop_mha(lc), rtol=0, atol=1e-13)
    assert mha(lc) is out  # cached


@pytest.mark.clauses("ATTN-MHA-1")
def test_mha_with_fully_masked_row_outputs_the_output_bias():
    rng = np.random.default_rng(1)
    mask = np.ones((1, 3, 4), bool)
    mask[0, 1] = False
    lc = random_layer_case(rng, B=1, Lq=3, Lk=4, E=8, num_heads=4, mask=mask)
    np.testing.assert_array_equal(mha(lc)[0, 1], lc.b_o)  # ATTN-EMPTY-1 per head, then W_O
    np.testing.assert_allclose(mha(lc), loop_mha(lc), rtol=0, atol=1e-13)


@pytest.mark.clauses("ATTN-MHA-1")
def test_single_head_equals_one_attention_over_full_width():
    rng = np.random.default_rng(2)
    lc = random_layer_case(rng, B=1, Lq=4, Lk=6, E=6, num_heads=1, biases=False)
    q, k, v = lc.x_q @ lc.w_q, lc.x_k @ lc.w_k, lc.x_v @ lc.w_v
    s = q @ np.swapaxes(k, 1, 2) / math.sqrt(6)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(mha(lc), (w @ v) @ lc.w_o, rtol=0, atol=1e-13)


@pytest.mark.clauses("ATTN-DTYPE-1", "ATTN-TOL-1")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_build_rounds_and_naive_mha_error_is_of_dtype_order(dtype):
    lc = random_layer_case(np.random.default_rng(3), B=2, Lq=6, Lk=9, E=16, num_heads=4, dtype=dtype,
                           mask="random")
    t = numpy_dtype(dtype)
    for name in ("x_q", "x_k", "x_v", "w_q", "w_k", "w_v", "w_o", "b_q", "b_o"):
        arr = getattr(lc, name)
        assert arr.dtype == np.float64 and np.array_equal(arr.astype(t).astype(np.float64), arr)
    ref = mha(lc)
    err = np.abs(naive_mha(lc) - ref).max() / np.abs(ref).max()
    eps = float(ml_dtypes.finfo(t).eps)
    assert 0.05 * eps <= err <= 30 * eps, err / eps
    with pytest.raises(ValueError, match="float64"):
        naive_mha(lc, "float64")


def test_build_validates_shapes():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 6))
    w = np.eye(6)
    with pytest.raises(CaseError, match="divisible"):
        LayerCase.build(x, x, x, w, w, w, w, num_heads=4)
    with pytest.raises(CaseError, match="w_o"):
        LayerCase.build(x, x, x, w, w, w, np.eye(5), num_heads=2)
    with pytest.raises(CaseError, match="mask"):
        LayerCase.build(x, x, x, w, w, w, w, num_heads=2, mask=np.ones((3, 3), bool))
    with pytest.raises(CaseError, match="causal"):
        LayerCase.build(x, x, x, w, w, w, w, num_heads=2, causal="bottom_right")
    lc = LayerCase.build(x, x, x, w, w, w, w, num_heads=3)
    assert lc.head_dim == 2 and lc.b_q is None and "heads=3" in lc.summary()
    assert lc.describe()["num_heads"] == 3 and lc.describe()["biases"] == []
    assert lc.replace(num_heads=2).head_dim == 3
