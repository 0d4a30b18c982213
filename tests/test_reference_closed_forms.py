"""The oracle on inputs whose answer is known in closed form, and on hostile values."""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.reference import Case, forward, oracle


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.clauses("ATTN-PROP-11")
@pytest.mark.parametrize("mask_kind", ["none", "mask", "padding"])
def test_identical_keys_give_mean_of_visible_values(mask_kind):
    rng = _rng(1)
    q = rng.standard_normal((2, 2, 4, 3))
    k = np.broadcast_to(rng.standard_normal(3), (2, 2, 6, 3)).copy()
    v = rng.standard_normal((2, 2, 6, 5))
    params = {}
    vis = np.ones((2, 2, 4, 6), bool)
    if mask_kind == "mask":
        vis = rng.random((2, 2, 4, 6)) < 0.5
        vis[..., 0] = True
        params["mask"] = vis
    elif mask_kind == "padding":
        params["kv_lengths"] = np.array([2, 5])
        vis[0, ..., 2:] = False
        vis[1, ..., 5:] = False
    out = forward(q, k, v, **params).out
    expected = (vis[..., None] * v[:, :, None]).sum(axis=3) / vis.sum(axis=-1)[..., None]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-14)


@pytest.mark.clauses("ATTN-PROP-13", "ATTN-W-3")
def test_one_dominant_logit_selects_its_value_row():
    rng = _rng(2)
    v = rng.standard_normal((1, 1, 5, 4))
    bias = np.zeros((1, 1, 3, 5))
    winners = [4, 0, 2]
    for i, j in enumerate(winners):
        bias[0, 0, i, j] = 1e4
    q = rng.standard_normal((1, 1, 3, 4))
    k = rng.standard_normal((1, 1, 5, 4))
    f = forward(q, k, v, bias=bias)
    np.testing.assert_array_equal(f.out[0, 0], v[0, 0, winners])
    logit = f.logits[0, 0, np.arange(3), winners]
    np.testing.assert_allclose(f.lse[0, 0], logit, rtol=1e-15)


@pytest.mark.clauses("ATTN-OP-1", "ATTN-W-1")
def test_single_key_returns_its_value():
    rng = _rng(3)
    q = rng.standard_normal((2, 3, 4, 5))
    k = rng.standard_normal((2, 3, 1, 5))
    v = rng.standard_normal((2, 3, 1, 6))
    f = forward(q, k, v)
    np.testing.assert_array_equal(f.out, np.broadcast_to(v, f.out.shape))
    np.testing.assert_array_equal(f.weights, np.ones_like(f.weights))
    np.testing.assert_allclose(f.lse, f.logits[..., 0], rtol=0, atol=0)


@pytest.mark.clauses("ATTN-PROP-6")
def test_row_constant_bias_changes_nothing():
    rng = _rng(4)
    q, k, v = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 7, 4)), rng.standard_normal((2, 2, 7, 3))
    row = rng.standard_normal((2, 2, 5, 1)) * 50
    base = forward(q, k, v, causal="top_left")
    shifted = forward(q, k, v, causal="top_left", bias=np.broadcast_to(row, (2, 2, 5, 7)))
    np.testing.assert_allclose(shifted.out, base.out, rtol=0, atol=1e-13)
    np.testing.assert_allclose(shifted.lse, base.lse + row[..., 0], rtol=1e-14, atol=1e-13)


@pytest.mark.clauses("ATTN-PROP-13")
@pytest.mark.parametrize("big", [1e300, -1e300])
def test_huge_finite_logits_neither_overflow_nor_nan(big):
    rng = _rng(5)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 2))
    bias = rng.standard_normal((1, 2, 3, 5))
    bias[..., 1] = big
    bias[0, 1, 0] = big  # a row in which every logit is huge
    with np.errstate(all="raise"):
        f = forward(q, k, v, bias=bias)
    assert np.isfinite(f.out).all() and np.isfinite(f.lse).all()
    if big > 0:
        np.testing.assert_array_equal(f.out[0, 0], np.repeat(v[0, 0, 1:2], 3, axis=0))
    else:
        ordinary = forward(q, k, v, bias=np.where(bias == big, -np.inf, bias)).out
        np.testing.assert_allclose(f.out[0, 0], ordinary[0, 0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(f.out[0, 1, 0], v[0, 1].mean(axis=0), rtol=0, atol=1e-15)


@pytest.mark.clauses("ATTN-MASK-3", "ATTN-NAN-2")
@pytest.mark.parametrize("poison", [1e30, -1e30, np.nan, np.inf])
@pytest.mark.parametrize("how", ["mask", "padding", "causal", "bias_neginf"])
def test_masked_positions_cannot_leak(poison, how):
    rng = _rng(6)
    q, k, v = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 6, 3)), rng.standard_normal((2, 2, 6, 3))
    if how == "mask":
        params = {"mask": np.arange(6) < 4}
    elif how == "padding":
        params = {"kv_lengths": np.array([4, 4])}
    elif how == "causal":
        params = {"causal": "top_left", "mask": np.arange(6) < 4}
    else:
        params = {"bias": np.where(np.arange(6) < 4, 0.5, -np.inf)}
    clean = Case.build(q, k, v, **params)
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] = poison
    v2[..., 4:, :] = poison
    dirty = clean.replace(k=k2, v=v2)
    np.testing.assert_array_equal(oracle(dirty).out, oracle(clean).out)
    np.testing.assert_array_equal(oracle(dirty).lse, oracle(clean).lse)
    np.testing.assert_array_equal(oracle(dirty).weights, oracle(clean).weights)
