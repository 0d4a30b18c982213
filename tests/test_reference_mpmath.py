"""The float64 oracle against a 50-digit mpmath evaluation written straight from the definition.

The mpmath version shares no code with reference/: visibility, causal alignment,
padding and GQA grouping are re-derived here from the clause statements, with
plain loops, so that a mistake in the vectorised oracle cannot hide in both.
"""
from __future__ import annotations

import math
import zlib

import mpmath
import numpy as np
import pytest

from attnconf.reference import Case, naive_forward, numpy_dtype, oracle

mpmath.mp.dps = 50


def mp_attention(q, k, v, *, mask=None, bias=None, causal=None, scale=None, q_lengths=None, kv_lengths=None):
    """(out, lse) as float64 arrays, computed at 50 digits from ATTN-OP-1 and its clauses."""
    B, Hq, Lq, Dk = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    full = (B, Hq, Lq, Lk)
    m = None if mask is None else np.broadcast_to(mask, full)
    bb = None if bias is None else np.broadcast_to(bias, full)
    s = mpmath.mpf(1) / mpmath.sqrt(Dk) if scale is None else mpmath.mpf(scale)
    out = np.zeros((B, Hq, Lq, Dv))
    lse = np.full((B, Hq, Lq), -np.inf)
    for b in range(B):
        ql = Lq if q_lengths is None else int(q_lengths[b])
        kl = Lk if kv_lengths is None else int(kv_lengths[b])
        for h in range(Hq):
            hk = h // (Hq // Hkv)  # ATTN-GQA-1: repeat_interleave grouping
            for i in range(Lq):
                logits = {}
                for j in range(Lk):
                    if i >= ql or j >= kl:
                        continue
                    if causal == "top_left" and j > i:
                        continue
                    if causal == "bottom_right" and j > i + (kl - ql):
                        continue
                    if m is not None and not m[b, h, i, j]:
                        continue
                    if bb is not None and bb[b, h, i, j] == -np.inf:
                        continue
                    dot = mpmath.fsum(mpmath.mpf(q[b, h, i, d]) * mpmath.mpf(k[b, hk, j, d]) for d in range(Dk))
                    logits[j] = s * dot + (0 if bb is None else mpmath.mpf(bb[b, h, i, j]))
                if not logits:
                    continue  # ATTN-EMPTY-1/2: output 0, lse -inf
                z = mpmath.fsum(mpmath.exp(x) for x in logits.values())
                lse[b, h, i] = float(mpmath.log(z))
                for d in range(Dv):
                    out[b, h, i, d] = float(mpmath.fsum(mpmath.exp(x) / z * mpmath.mpf(v[b, hk, j, d])
                                                        for j, x in logits.items()))
    return out, lse


def _case(seed: int, B=2, Hq=2, Hkv=None, Lq=5, Lk=6, Dk=3, Dv=4, dtype="float64", **params) -> Case:
    rng = np.random.default_rng(seed)
    Hkv = Hq if Hkv is None else Hkv
    q = rng.standard_normal((B, Hq, Lq, Dk))
    k = rng.standard_normal((B, Hkv, Lk, Dk))
    v = rng.standard_normal((B, Hkv, Lk, Dv))
    return Case.build(q, k, v, dtype=dtype, **params)


def _mask(seed, shape, p=0.6):
    rng = np.random.default_rng(seed)
    return rng.random(shape) < p


def _bias_with_neginf(seed, shape):
    rng = np.random.default_rng(seed)
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < 0.3] = -np.inf
    return bias


def _fully_masked_mask():
    m = _mask(7, (2, 1, 5, 6))
    m[0, 0, 1] = False
    m[1, 0, 4] = False
    return m


CASES = {
    "plain": dict(),
    "bool_mask": dict(mask=_mask(1, (2, 2, 5, 6))),
    "bool_mask_broadcast": dict(mask=_mask(2, (5, 6))),
    "bias_neginf": dict(bias=_bias_with_neginf(3, (2, 1, 5, 6))),
    "bias_and_mask": dict(bias=_bias_with_neginf(4, (1, 2, 1, 6)), mask=_mask(5, (2, 1, 5, 6))),
    "causal_top_left_lq_lt_lk": dict(causal="top_left", Lq=4, Lk=7),
    "causal_top_left_lq_gt_lk": dict(causal="top_left", Lq=7, Lk=4),
    "causal_bottom_right_lq_lt_lk": dict(causal="bottom_right", Lq=4, Lk=7),
    "causal_bottom_right_lq_gt_lk": dict(causal="bottom_right", Lq=7, Lk=4),  # empty top rows
    "causal_bottom_right_padded": dict(causal="bottom_right", Lq=6, Lk=7,
                                       q_lengths=[6, 4], kv_lengths=[5, 7]),
    "padding": dict(q_lengths=[5, 3], kv_lengths=[2, 6]),
    "padding_zero_kv": dict(q_lengths=[5, 5], kv_lengths=[0, 4]),
    "gqa_4_2": dict(Hq=4, Hkv=2),
    "gqa_4_1_causal": dict(Hq=4, Hkv=1, causal="top_left"),
    "fully_masked_rows": dict(mask=_fully_masked_mask()),
    "custom_scale": dict(scale=0.37),
    "custom_scale_large": dict(scale=3.5, bias=np.linspace(-2, 2, 6)),
    "dv_ne_dk": dict(Dk=5, Dv=2),
}


@pytest.mark.clauses("ATTN-OP-1", "ATTN-OP-3", "ATTN-OP-4", "ATTN-W-3", "ATTN-MASK-1", "ATTN-MASK-2",
                     "ATTN-MASK-4", "ATTN-MASK-6", "ATTN-CAUSAL-1", "ATTN-CAUSAL-3", "ATTN-GQA-1",
                     "ATTN-GQA-2", "ATTN-EMPTY-1", "ATTN-EMPTY-2")
@pytest.mark.parametrize("name", sorted(CASES))
def test_oracle_matches_mpmath(name):
    case = _case(zlib.crc32(name.encode()) % 1000, **CASES[name])
    ref = oracle(case)
    out, lse = mp_attention(case.q, case.k, case.v, mask=case.mask, bias=case.bias, causal=case.causal,
                            scale=case.scale, q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
    vmax = np.abs(case.v).max()
    assert np.abs(ref.out - out).max() <= 1e-12 * vmax
    empty = np.isneginf(lse)
    assert np.array_equal(np.isneginf(ref.lse), empty)
    assert np.all(ref.out[empty] == 0.0)
    assert np.all(np.abs(ref.lse[~empty] - lse[~empty]) <= 1e-12 * np.maximum(1.0, np.abs(lse[~empty])))


def test_bottom_right_lq_gt_lk_has_empty_top_rows():
    case = _case(11, **CASES["causal_bottom_right_lq_gt_lk"])
    assert np.isneginf(oracle(case).lse[:, :, :3]).all()
    assert not np.isneginf(oracle(case).lse[:, :, 3:]).any()


def _eps(dtype: str) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(numpy_dtype(dtype)).eps)


@pytest.mark.clauses("ATTN-TOL-1")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["plain", "bias_neginf", "causal_bottom_right_padded", "gqa_4_2"])
def test_emulated_baseline_error_is_of_dtype_order(dtype, name):
    """The naive baseline at dtype t is off by a few eps_t * max|V|, and never exactly right."""
    case = _case(zlib.crc32(name.encode()) % 1000 + 1, dtype=dtype, Lq=16, Lk=24, Dk=16, Dv=16,
                 **{k: v for k, v in CASES[name].items() if k not in ("Lq", "Lk", "mask", "bias")})
    out, lse = naive_forward(case)
    ref = oracle(case)
    err = np.abs(out - ref.out).max()
    vmax = np.abs(case.v).max()
    eps = _eps(dtype)
    assert 0.0 < err <= 10 * eps * vmax
    assert err >= 0.05 * eps * vmax  # the baseline really works at precision t, not better
    finite = np.isfinite(ref.lse)
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.abs(lse[finite] - ref.lse[finite]).max() <= 10 * eps * max(1.0, np.abs(ref.lse[finite]).max())


def test_mpmath_helper_is_exact_on_a_hand_example():
    """The mpmath helper itself, on a 1x1x1x2 example solved by hand."""
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = np.array([[[[2.0], [4.0]]]])
    out, lse = mp_attention(q, k, v, scale=1.0)
    w0 = math.e / (math.e + 1.0)
    assert out[0, 0, 0, 0] == pytest.approx(2 * w0 + 4 * (1 - w0), rel=1e-15)
    assert lse[0, 0, 0] == pytest.approx(math.log(math.e + 1.0), rel=1e-15)
