"""The finite_mask_bias alternative: what a kernel computes that receives hidden keys as a boolean mask and
adds it as a finite bias in float32 (torch's and JAX's cuDNN paths on an H100, adapters/torch and adapters/jax divergences.toml)."""
from __future__ import annotations

import numpy as np

from attnconf.conformance.engine.alternatives import finite_mask_bias_case
from attnconf.reference import Case, oracle


def _case(dtype: str = "float16", **kw) -> Case:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 1, n, 8)) for n in (5, 6, 6))
    return Case.build(q, k, v, dtype=dtype, **kw)


def test_minus_32768_keeps_the_logits_so_an_empty_row_attends_over_its_hidden_keys():
    mask = np.ones((2, 1, 5, 6), dtype=bool)
    mask[0, 0, 2] = False
    case = _case(mask=mask)
    got = oracle(finite_mask_bias_case(case, -32768.0)).out
    unmasked = oracle(case.replace(mask=None)).out
    np.testing.assert_allclose(got[0, 0, 2], unmasked[0, 0, 2], atol=1e-3)
    np.testing.assert_allclose(np.delete(got[0, 0], 2, axis=0), np.delete(oracle(case).out[0, 0], 2, axis=0), atol=1e-9)


def test_minus_2_pow_41_erases_them_and_padding_outside_the_mask_stays_excluded():
    """JAX's bfloat16 cuDNN call: the mask and bottom-right causal get the bias, the kv lengths do not."""
    case = _case("bfloat16", causal="bottom_right", kv_lengths=np.array([2, 6]), q_lengths=np.array([5, 3]))
    alt = finite_mask_bias_case(case, -2.0 ** 41, ["mask", "causal"])
    got = oracle(alt).out
    ref = oracle(case)
    empty = ~ref.visible.any(-1)
    assert empty[0, 0, :3].all()   # bottom-right causal with 2 keys for 5 queries empties the first three rows
    for i in range(3):   # uniform over the two keys causal hides; the keys beyond kv length 2 stay excluded
        np.testing.assert_allclose(got[0, 0, i], case.v[0, 0, :2].mean(axis=0), atol=1e-3)
    np.testing.assert_array_equal(got[1, 0, 3:], 0.0)   # rows beyond q length 3 stay empty: 0, as the spec says


def test_by_default_padding_is_part_of_the_mask():
    """torch's SDPA convention folds the lengths into the boolean attn_mask: a padded query row attends too."""
    case = _case(q_lengths=np.array([5, 3]))
    got = oracle(finite_mask_bias_case(case, -32768.0)).out
    assert np.abs(got[1, 0, 3:]).min() > 0
    np.testing.assert_allclose(got[1, 0, 3:], oracle(case.replace(q_lengths=None)).out[1, 0, 3:], atol=1e-3)
