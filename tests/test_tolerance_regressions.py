"""Correct kernels that the old 2x-baseline criterion flagged pass the tolerance model (SPEC 12.1, item 5).

Each fixture is a float32 case a correct implementation failed under an envelope that sampled only
the naive orders of the logits' dot products: rows whose weights hang on the difference of two
logits in the hundreds or thousands, where the kernel's own summation order landed beyond all of
the sampled ones (ratios 2.12 to 4.7). The logit-order term of the baseline covers them; without it
each case fails again (the ratios are in the entries this term retired: TORCH-FLEX-CPU-LARGE-LOGITS,
ONNX-ORT-GQA-LARGE-LOGITS, and the flash_attn_func control's recorded false alarm). Each runs its
kernel in its own framework, skipped where that is not installed.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from attnconf.conformance.engine.tolerance import judge_output, rounding_noise
from attnconf.reference import Case, naive_forward, oracle
from attnconf.reference.emulate import VARIANTS, logit_order_error

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tolerance"
# fixture -> (module that must be importable, backend, implementation or --kernel, convention)
CASES = {
    "flash-control-overflow-f32.npz": ("torch", "torch", "tests.kernels.flash:flash_attn_func", "flash_attn"),
    "torch-flex-large-logits-f32.npz": ("torch", "torch", "torch:flex", None),
    "onnx-ort-gqa-large-logits-f32.npz": ("onnxruntime", "onnx", "onnx:ort-gqa", None),
}


def _adapter(backend: str, which: str, convention: str | None):
    from attnconf import adapters

    if ":" in which and convention is not None:
        return adapters.load(backend, kernel=which, convention=convention)[0]
    return adapters.load(backend, impl=which)[0]


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_correct_kernel_passes_on_its_large_logit_case(fixture):
    module, backend, which, convention = CASES[fixture]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    case = Case.load(FIXTURES / fixture)
    adapter = _adapter(backend, which, convention)
    assert adapter.supports(case) is True
    ref = oracle(case).out
    seen = np.broadcast_to(oracle(case).visible.any(axis=-1)[..., None], ref.shape)   # empty rows: other entries
    j = judge_output(adapter.run(case).out, case, mask=seen)
    assert j.ok, j.explain()
    # the term did the work: 2 x the variants' envelope + floor alone would not have allowed this error.
    # The kernels' summation order depends on the CPU's vector paths: the fixtures were stored on an AMD
    # EPYC (AVX-512F); on an Intel Xeon of this workplace (2026-11-24) torch flex and onnxruntime landed
    # exactly on a naive variant's error. There the pass above is all the case shows, and it says so.
    envelope = max(float(np.abs(np.where(seen, naive_forward(case, v)[0] - ref, 0.0)).max()) for v in VARIANTS)
    floor = 2 * float(rounding_noise(np.where(seen, ref, 0.0), case.dtype).max())
    if which.startswith("tests.") or j.e_max > 2 * envelope + floor:
        assert j.e_max > 2 * envelope + floor, (j.e_max, envelope, floor)   # our own kernel: same order everywhere
    else:
        pytest.skip(f"passes; on this CPU the kernel's error {j.e_max:.3g} is within the naive variants' envelope "
                    f"{envelope:.3g}, so the case does not exercise the logit-order term here")


def test_logit_order_term_is_zero_where_nothing_is_summed():
    """Empty rows, and rows whose only visible key takes all the weight, get no allowance from the term."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 1, 3, 4)), rng.normal(size=(1, 1, 1, 4)), rng.normal(size=(1, 1, 1, 4))
    case = Case.build(q, k, v, dtype="float32", mask=np.array([True, False, True])[None, None, :, None])
    out, lse = logit_order_error(case)
    assert (out == 0).all()                       # one key: O = v exactly, |v - O| = 0
    assert lse[0, 0, 1] == 0 and lse[0, 0, 0] > 0  # the empty row has no term; the lse of a seen key has one


def test_floor_is_finite_at_and_beyond_the_dtype_range():
    """A magnitude at or past the dtype's largest finite value (a float16 gradient's summed terms reach
    66157 on the fixture below) gets the ulp of its binade: a NaN or inf floor would fail an exact
    result, or pass any result."""
    from attnconf.conformance.engine.tolerance import judge_arrays, ulp

    for dtype, top in (("float16", 65504.0), ("bfloat16", 3.3895313892515355e38), ("float32", 3.4028234663852886e38)):
        mags = np.array([top, top * 1.01, top * 16])
        noise = rounding_noise(mags, dtype)
        assert np.isfinite(noise).all() and (noise > 0).all(), (dtype, noise)
        assert np.array_equal(ulp(mags, dtype), noise)
    assert ulp(np.array([65504.0]), "float16")[0] == 32 and ulp(np.array([66157.0]), "float16")[0] == 64
    zeros = np.zeros((1, 1, 4, 96))
    ok = judge_arrays(zeros, zeros, zeros, "float16", quantity="dk", model="gradient",
                      magnitude=np.full_like(zeros, 66157.0))
    assert ok.ok and np.isfinite(ok.allowed_max), ok.explain()
    big = np.full((1, 1, 2, 2), 65504.0)
    wrong = judge_arrays(big + 4096.0, big, np.zeros_like(big), "float16")
    assert not wrong.ok and np.isfinite(wrong.allowed_max), wrong.explain()


def test_correct_kernel_passes_where_gradient_terms_pass_the_float16_range():
    """The case that failed a correct kernel with 'allowed nan' (dK of float16, magnitude 66157)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    from attnconf.conformance.engine.tolerance import judge_gradients

    case = Case.load(FIXTURES / "fp16-grad-magnitude-beyond-max.npz")
    adapter = _adapter("torch", "tests.kernels.correct:naive", "sdpa")
    for j in judge_gradients(adapter.run(case, grads=True).grads, case):
        assert j.ok and np.isfinite(j.allowed_max), j.explain()


def test_float64_comparisons_allow_a_flushed_subnormal_and_nothing_more():
    """flax's empty-row dK (make report, float64): the reference held -6.0e-314 where the kernel returned 0,
    and the uniform_weight_gradients alternative demanded it exactly, its bound (relative) underflowing to 0.
    Every float64 comparison allows float64's smallest normal number (2.2e-308) of absolute error: a
    subnormal keeps no relative precision. An error of 1e-300 still fails."""
    from attnconf.conformance.engine import alternatives
    from attnconf.conformance.engine.alternatives_registry import GRADIENTS
    from attnconf.reference.backward import backward

    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 1, 2, 4)), rng.normal(size=(1, 1, 3, 4)), rng.normal(size=(1, 1, 3, 4))
    keep = np.array([[True, True, True], [False, False, False]])[None, None]
    case = Case.build(q * 1e-312, k, v, mask=keep, dtype="float64", grad_out=rng.normal(size=(1, 1, 2, 4)))
    ref = backward(case)
    entry = {"instead": "uniform_weight_gradients", "quantities": list(GRADIENTS)}
    rows = ~oracle(case).visible.any(axis=-1)
    masks = {"dk": np.ones(ref.dk.shape, bool)}

    class Res:
        def __init__(self, dk):
            self.grads = {"dk": dk}
    tiny = np.abs(ref.dk[np.abs(ref.dk) > 0]).min()
    assert tiny < np.finfo(np.float64).tiny, tiny      # the reference's dK is subnormal (q ~ 1e-312)
    assert rows.any()
    flushed = np.where(np.abs(ref.dk) < np.finfo(np.float64).tiny, 0.0, ref.dk)
    assert alternatives.ALTERNATIVES["uniform_weight_gradients"].check(entry, case, Res(flushed), masks).ok
    off = ref.dk + 1e-300
    assert not alternatives.ALTERNATIVES["uniform_weight_gradients"].check(entry, case, Res(off), masks).ok
