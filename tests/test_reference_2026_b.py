"""The references of issue 26 part b against independent computations: MLA's two forms (ATTN-MLA-1, -2),
sparse top-k as a set (ATTN-SPARSE-1..3), and the merge of attention states (ATTN-LSE-7)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from attnconf.reference import empty_as_spec, forward, merge_partials, merge_states
from attnconf.reference.mla import absorbed, latent_attention, non_absorbed
from attnconf.reference.sparse import index_mask, max_logits, sparse_forward


def _mla(seed=0, B=2, H=3, Lq=4, Lk=6, dn=5, dr=3, dc=7, dv=4):
    rng = np.random.default_rng(seed)
    return dict(q_nope=rng.normal(size=(B, H, Lq, dn)), q_rope=rng.normal(size=(B, H, Lq, dr)),
                c=rng.normal(size=(B, Lk, dc)), k_rope=rng.normal(size=(B, Lk, dr)),
                w_uk=rng.normal(size=(H, dn, dc)) / 2, w_uv=rng.normal(size=(H, dv, dc)) / 2)


@pytest.mark.clauses("ATTN-MLA-2")
@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_absorbed_equals_non_absorbed(causal):
    a = _mla(1)
    f1, f2 = non_absorbed(**a, causal=causal), absorbed(**a, causal=causal)
    np.testing.assert_allclose(f2.out, f1.out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f2.lse, f1.lse, rtol=1e-12, atol=1e-12)


@pytest.mark.clauses("ATTN-MLA-1", "ATTN-MLA-2")
def test_non_absorbed_by_hand():
    """One batch, one head, loops over keys with math.exp: the non-absorbed form's definition."""
    a = _mla(2, B=1, H=1, Lq=2, Lk=3)
    f = non_absorbed(**a)
    s = 1 / math.sqrt(a["q_nope"].shape[-1] + a["q_rope"].shape[-1])
    for i in range(2):
        logits = []
        for j in range(3):
            k_nope = a["w_uk"][0] @ a["c"][0, j]
            logits.append(s * (a["q_nope"][0, 0, i] @ k_nope + a["q_rope"][0, 0, i] @ a["k_rope"][0, j]))
        z = sum(math.exp(x) for x in logits)
        out = sum(math.exp(x) / z * (a["w_uv"][0] @ a["c"][0, j]) for j, x in enumerate(logits))
        np.testing.assert_allclose(f.out[0, 0, i], out, rtol=1e-12)
        assert f.lse[0, 0, i] == pytest.approx(math.log(z), abs=1e-12)


@pytest.mark.clauses("ATTN-MLA-1")
def test_latent_value_is_the_prefix_of_the_row():
    rng = np.random.default_rng(3)
    q, rows = rng.normal(size=(1, 2, 3, 9)), rng.normal(size=(1, 1, 5, 9))
    f = latent_attention(q, rows, 6)
    np.testing.assert_allclose(f.out, forward(q, rows, rows[..., :6]).out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="prefix"):
        latent_attention(q, rows, 10)


@pytest.mark.clauses("ATTN-SPARSE-1", "ATTN-SPARSE-2", "ATTN-SPARSE-3")
def test_sparse_is_attention_over_the_set_of_valid_indices():
    """Against a loop over Python sets: order, duplicates, -1 and indices >= Lk change nothing."""
    rng = np.random.default_rng(4)
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 3, 7, 5
    q, k, v = rng.normal(size=(B, Hq, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)), rng.normal(size=(B, Hkv, Lk, D))
    idx = rng.integers(-1, Lk + 3, size=(B, Hkv, Lq, 9))
    idx[0, 0, 0] = -1                                               # an empty row
    f = sparse_forward(q, k, v, idx, scale=0.5)
    ml = max_logits(f)
    for b in range(B):
        for h in range(Hq):
            for i in range(Lq):
                keys = sorted({int(j) for j in idx[b, h // 2, i] if 0 <= j < Lk})
                if not keys:
                    assert np.all(f.out[b, h, i] == 0) and np.isneginf(f.lse[b, h, i]) and np.isneginf(ml[b, h, i])
                    continue
                logits = [0.5 * float(q[b, h, i] @ k[b, h // 2, j]) for j in keys]
                z = sum(math.exp(x) for x in logits)
                out = sum(math.exp(x) / z * v[b, h // 2, j] for j, x in zip(keys, logits))
                np.testing.assert_allclose(f.out[b, h, i], out, rtol=1e-12, atol=1e-14)
                assert f.lse[b, h, i] == pytest.approx(math.log(z), abs=1e-12)
                assert ml[b, h, i] == pytest.approx(max(logits), abs=1e-14)
    shuffled = np.concatenate([idx[..., ::-1], idx[..., :3]], axis=-1)     # reversed, three duplicated
    np.testing.assert_array_equal(sparse_forward(q, k, v, shuffled, scale=0.5).out, f.out)


def test_index_mask_rejects_float_indices():
    with pytest.raises(ValueError, match="integers"):
        index_mask(np.zeros((2, 3)), 4)


# ---- merging attention states ------------------------------------------------------------------
def _parts(seed, n=3, rows=5, dv=4, lk=12):
    """n disjoint chunks of one random problem: (outs, lses) and the whole (out, lse)."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(1, 1, rows, 6)), rng.normal(size=(1, 1, lk, 6)), rng.normal(size=(1, 1, lk, dv))
    owner = rng.integers(0, n, size=lk)
    parts = [forward(q, k, v, mask=np.broadcast_to(owner == c, (1, 1, rows, lk))) for c in range(n)]
    whole = forward(q, k, v)
    return [p.out for p in parts], [p.lse for p in parts], whole


@pytest.mark.clauses("ATTN-LSE-7")
@pytest.mark.parametrize("seed", range(4))
def test_merge_is_the_whole_commutative_and_associative(seed):
    outs, lses, whole = _parts(seed)
    out, lse = merge_states(*merge_states(outs[0], lses[0], outs[1], lses[1]), outs[2], lses[2])
    np.testing.assert_allclose(out, whole.out, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, whole.lse, rtol=1e-13, atol=1e-13)
    out2, lse2 = merge_states(outs[2], lses[2], *merge_states(outs[1], lses[1], outs[0], lses[0]))
    np.testing.assert_allclose(out2, out, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(lse2, lse, rtol=1e-14, atol=1e-14)


@pytest.mark.clauses("ATTN-LSE-7")
def test_merge_with_an_empty_part_is_exact():
    outs, lses, _ = _parts(7, n=1)
    empty_out = np.full_like(outs[0], np.nan)            # an empty part's output is never read
    out, lse = merge_states(outs[0], lses[0], empty_out, np.full_like(lses[0], -np.inf))
    np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_array_equal(lse, lses[0])


@pytest.mark.clauses("ATTN-LSE-7", "ATTN-LSE-6")
def test_plus_inf_is_all_the_mass_and_the_sentinel_is_mapped_first():
    o_a, o_b = np.array([[1.0, 2.0]]), np.array([[5.0, 7.0]])
    out, lse = merge_states(o_a, np.array([np.inf]), o_b, np.array([0.3]))
    np.testing.assert_array_equal(out, o_a)
    assert np.isposinf(lse[0])
    # a flash-attention / FlashMLA empty row (+inf) is mapped to -inf before merging: then it is empty
    out, lse = merge_states(o_a * 0, empty_as_spec(np.array([np.inf]), np.inf), o_b, np.array([0.3]))
    np.testing.assert_array_equal(out, o_b)
    assert lse[0] == 0.3
