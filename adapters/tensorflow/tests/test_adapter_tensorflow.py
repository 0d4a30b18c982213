"""The TensorFlow / Keras adapter: it translates cases faithfully and its divergences are real.

Imports TensorFlow only (never torch). Skipped where TensorFlow is not installed.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from attnconf import adapters  # noqa: E402
from attnconf.adapters import KernelError  # noqa: E402
from attnconf.adapters.tensorflow import adapter as tfa  # noqa: E402
from attnconf.conformance.engine.tolerance import judge_output  # noqa: E402
from attnconf.reference import Case, oracle, visibility  # noqa: E402
from attnconf.reference.backward import backward  # noqa: E402
from attnconf.reference.layer import LayerCase, mha  # noqa: E402

RNG = np.random.default_rng(2024)


@pytest.fixture(scope="module")
def impls() -> dict:
    return {a.name: a for a in adapters.load("tensorflow")}


def make(B=2, Hq=4, Hkv=4, Lq=5, Lk=7, Dk=8, Dv=8, **params) -> Case:
    q = RNG.normal(size=(B, Hq, Lq, Dk))
    k = RNG.normal(size=(B, Hkv, Lk, Dk))
    v = RNG.normal(size=(B, Hkv, Lk, Dv))
    return Case.build(q, k, v, **params)


def diag_mask(lq: int, lk: int) -> np.ndarray:
    """A random mask that keeps every row non-empty."""
    m = RNG.random((2, 1, lq, lk)) < 0.6
    m[..., np.arange(lq), np.arange(lq) % lk] = True
    return m


CASES = {
    "plain": lambda: make(),
    "mask": lambda: make(mask=diag_mask(5, 7)),
    "bias": lambda: make(bias=RNG.normal(size=(1, 4, 5, 7))),
    "causal-top-left-cross": lambda: make(causal="top_left"),
    "causal-bottom-right-cross": lambda: make(causal="bottom_right"),
    "mask+causal": lambda: make(Lq=6, Lk=6, mask=diag_mask(6, 6), causal="top_left"),
    "kv_lengths": lambda: make(kv_lengths=[3, 7]),
    "gqa": lambda: make(Hkv=2),
    "scale": lambda: make(scale=0.3),
    "dv_ne_dk": lambda: make(Dv=5),
}


def test_flags_recorded(impls):
    assert os.environ["KERAS_BACKEND"] == "tensorflow"
    d = impls["tensorflow:keras-xla"].describe()
    assert d["keras_backend"] == "tensorflow" and d["xla"] is True
    assert d["allow_tf32"] is False and d["tf32_enabled"] is False
    assert impls["tensorflow:keras-eager"].describe()["xla"] is False


@pytest.mark.parametrize("impl_name", ["tensorflow:keras-eager", "tensorflow:keras-xla"])
@pytest.mark.parametrize("label", sorted(CASES))
def test_matches_reference_float32(impls, impl_name, label):
    case = CASES[label]().replace(dtype="float32")
    res = impls[impl_name].run(case)
    assert res.out_dtype == "float32"
    j = judge_output(res.out, case)
    assert j.ok, j.explain()


def test_float64_with_float32_exact_scale(impls):
    """Dk = 16: the default scale 1/4 is exact, so float64 is float64-accurate."""
    case = make(Dk=16, Dv=16, mask=diag_mask(5, 7), dtype="float64")
    for name in ("tensorflow:keras-eager", "tensorflow:keras-xla"):
        assert judge_output(impls[name].run(case).out, case).ok


def test_translation_of_masks_and_causal():
    case = make(Lq=6, Lk=4, causal="bottom_right", kv_lengths=[4, 2], bias=RNG.normal(size=(6, 4)))
    args = tfa.keras_arguments(case)
    assert args["query"].shape == (2, 6, 4, 8) and args["key"].shape == (2, 4, 4, 8)   # BTNH
    assert args["is_causal"] is False
    assert args["bias"] is case.bias
    vis = visibility((2, 4, 6, 4), causal="bottom_right", kv_lengths=case.kv_lengths)
    assert np.array_equal(np.broadcast_to(args["mask"], vis.shape), vis)
    top = tfa.keras_arguments(make(causal="top_left"))
    assert top["is_causal"] is True and top["mask"] is None


def test_gqa_grouping_is_repeat_interleave(impls):
    """Query heads 0,1 use KV head 0: giving KV head 1 garbage leaves them unchanged."""
    case = make(Hq=4, Hkv=2, dtype="float32")
    k2 = case.k.copy()
    k2[:, 1] = 50.0
    other = case.replace(k=k2)
    a = impls["tensorflow:keras-eager"]
    out1, out2 = a.run(case).out, a.run(other).out
    assert np.array_equal(out1[:, :2], out2[:, :2])
    assert not np.allclose(out1[:, 2:], out2[:, 2:])


def test_gradients_float64(impls):
    case = make(Dk=16, Dv=16, bias=RNG.normal(size=(1, 4, 5, 7)), causal="top_left", dtype="float64",
                grad_out=RNG.normal(size=(2, 4, 5, 16)))
    res = impls["tensorflow:keras-eager"].run(case, grads=True)
    ref = backward(case)
    for name in ("dq", "dk", "dv", "dbias"):
        got, want = res.grads[name], getattr(ref, name)
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_fully_masked_row_gives_mean_of_v(impls):
    """The measured divergence TF-KERAS-EMPTY-MEAN (the spec wants 0)."""
    m = np.ones((1, 1, 4, 6), bool)
    m[..., 1, :] = False
    case = make(B=1, Hq=1, Hkv=1, Lq=4, Lk=6, mask=m, dtype="float32")
    out = impls["tensorflow:keras-eager"].run(case).out
    np.testing.assert_allclose(out[0, 0, 1], case.v[0, 0].mean(axis=0), atol=1e-6)


def test_multi_query_raises(impls):
    """The measured bug TF-KERAS-MQA-RAISES."""
    with pytest.raises(KernelError, match="Einsum|dimension"):
        impls["tensorflow:keras-eager"].run(make(Hkv=1, dtype="float32"))


def test_float64_scale_rounded_to_float32(impls):
    """The measured bug TF-KERAS-F64-SCALE-F32: scale 0.3 costs ~1e-8, an exact float32 scale nothing."""
    a = impls["tensorflow:keras-eager"]
    base = make(dtype="float64")
    bad = base.replace(scale=0.3)
    good = base.replace(scale=float(np.float32(0.3)))
    assert np.abs(a.run(bad).out - oracle(bad).out).max() > 1e-9
    assert np.abs(a.run(good).out - oracle(good).out).max() < 1e-13


def layer_case(dtype="float64", mask=None, causal=None) -> LayerCase:
    B, Lq, Lk, E, H = 2, 5, 6, 12, 3
    w = [RNG.normal(size=(E, E)) / np.sqrt(E) for _ in range(4)]
    return LayerCase.build(RNG.normal(size=(B, Lq, E)), RNG.normal(size=(B, Lk, E)), RNG.normal(size=(B, Lk, E)), *w,
                           b_q=RNG.normal(size=E), b_o=RNG.normal(size=E), num_heads=H, mask=mask, causal=causal,
                           dtype=dtype)


@pytest.mark.parametrize("impl_name", ["tensorflow:keras-mha", "tensorflow:keras-mha-scores"])
def test_layer_matches_reference(impls, impl_name):
    a = impls[impl_name]
    assert a.kind == "layer"
    m = RNG.random((2, 5, 6)) < 0.6
    m[:, np.arange(5), np.arange(5)] = True
    for lc in (layer_case(), layer_case(mask=m, causal="top_left")):
        assert a.supports_layer(lc) is True
        np.testing.assert_allclose(a.run_layer(lc), mha(lc), rtol=0, atol=1e-12)


def test_layer_paths_differ_on_empty_rows(impls):
    m = np.ones((2, 5, 6), bool)
    m[:, 1] = False
    lc = layer_case(mask=m)
    ref = mha(lc)
    scores = impls["tensorflow:keras-mha-scores"].run_layer(lc)
    fused = impls["tensorflow:keras-mha"].run_layer(lc)
    np.testing.assert_allclose(scores, ref, rtol=0, atol=1e-12)
    assert np.abs(fused[:, 1] - ref[:, 1]).max() > 1e-3
    np.testing.assert_allclose(fused[:, [0, 2, 3, 4]], ref[:, [0, 2, 3, 4]], rtol=0, atol=1e-12)


def test_kernel_adapter_wraps_a_tf_function():
    import tensorflow as tf

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        s = tf.matmul(query, key, transpose_b=True) * (scale or 1 / np.sqrt(query.shape[-1]))
        if attn_mask is not None:
            s = tf.where(attn_mask, s, -np.inf) if attn_mask.dtype == tf.bool else s + attn_mask
        return tf.matmul(tf.nn.softmax(s, axis=-1), value)

    a = tfa.kernel_adapter(sdpa, "cpu", "tensorflow:kernel:test")
    case = make(mask=diag_mask(5, 7), dtype="float32")
    res = a.run(case)
    assert res.out_dtype == "float32" and judge_output(res.out, case).ok


def test_keras_xla_float16_case_of_the_upcast_placement_passes(impls):
    """keras-xla's float16 case that failed at 5.09x the old envelope (tests/test_tolerance_upcast_logits.py):
    Keras rounds the unscaled Q K^T to float16 and scales in float32; the "upcast" placement samples that."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tolerance" / "keras-unscaled-f16-logits-bias.npz"
    case = Case.load(fixture)
    j = judge_output(impls["tensorflow:keras-xla"].run(case).out, case)
    assert j.ok, j.explain()
