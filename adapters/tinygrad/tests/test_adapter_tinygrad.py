"""The tinygrad adapter: it maps cases faithfully, declares exactly what it can run, and its
divergences show on their witnesses.

Imports tinygrad only (no torch, JAX or TensorFlow). Skipped where tinygrad is not installed, or
where its CPU device cannot start (no clang): then the skip reason is the adapter's one-line reason.
Most cases share one shape (B=2, Hq=4, Lq=5, Lk=7, D=8) because tinygrad compiles every new shape.
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tinygrad")

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine.divergences import backend_entries  # noqa: E402
from attnconf.adapters.tinygrad import adapter as tga  # noqa: E402
from attnconf.adapters.tinygrad import alternatives as alternatives_tinygrad, regions as regions_tinygrad, witnesses as witnesses_tinygrad  # noqa: E402
from attnconf.conformance.engine.divergences import Divergences  # noqa: E402
from attnconf.conformance.engine.tolerance import judge_gradients, judge_output  # noqa: E402
from attnconf.conformance.engine.witnesses import WITNESSES  # noqa: E402
from attnconf.reference import Case, oracle  # noqa: E402
from attnconf.reference.backward import backward  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
RNG = np.random.default_rng(2025)


@pytest.fixture(scope="module")
def impl():
    try:
        [a] = adapters.load("tinygrad")
    except adapters.UsageError as exc:
        pytest.skip(str(exc))
    return a


def make(B=2, Hq=4, Hkv=4, Lq=5, Lk=7, Dk=8, Dv=8, **params) -> Case:
    q = RNG.normal(size=(B, Hq, Lq, Dk))
    k = RNG.normal(size=(B, Hkv, Lk, Dk))
    v = RNG.normal(size=(B, Hkv, Lk, Dv))
    return Case.build(q, k, v, **params)


def rows_kept(lq: int, lk: int) -> np.ndarray:
    """A random (2, 1, lq, lk) mask in which every row sees at least one key."""
    m = RNG.random((2, 1, lq, lk)) < 0.6
    m[..., np.arange(lq), np.arange(lq) % lk] = True
    return m


CASES = {
    "plain": lambda: make(),
    "mask": lambda: make(mask=rows_kept(5, 7)),
    "rank1-mask": lambda: make(mask=np.arange(7) != 3),
    "bias": lambda: make(bias=RNG.normal(size=(1, 4, 5, 7))),
    "bias-neg-inf": lambda: make(bias=np.where(rows_kept(5, 7), RNG.normal(size=(2, 1, 5, 7)), -np.inf)),
    "causal-top-left-cross": lambda: make(causal="top_left"),
    "causal-bottom-right-cross": lambda: make(causal="bottom_right"),
    "mask+causal": lambda: make(mask=rows_kept(5, 7), causal="top_left"),
    "bias+causal": lambda: make(bias=RNG.normal(size=(5, 7)), causal="bottom_right"),
    "kv_lengths": lambda: make(kv_lengths=[3, 7]),
    "gqa": lambda: make(Hkv=2),
    "mqa": lambda: make(Hkv=1),
    "exact-custom-scale": lambda: make(Dk=16, Dv=16, scale=0.125),   # Q * 0.125 * sqrt(16) = Q / 2: exact
    "dv_ne_dk": lambda: make(Dv=5),
    "noncontiguous": lambda: make(layout="noncontiguous"),
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_matches_reference_float32(impl, label):
    case = CASES[label]().replace(dtype="float32")
    assert impl.supports(case) is True
    res = impl.run(case)
    assert res.out_dtype == "float32" and res.out.shape == case.out_shape
    j = judge_output(res.out, case)
    assert j.ok, j.explain()


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_matches_reference_other_dtypes(impl, dtype):
    for case in (make(mask=rows_kept(5, 7), dtype=dtype), make(Hkv=2, causal="bottom_right", dtype=dtype),
                 make(scale=0.7, dtype="float64") if dtype == "float64" else make(dtype=dtype)):
        res = impl.run(case)
        assert res.out_dtype == dtype
        j = judge_output(res.out, case)
        assert j.ok, j.explain()


def test_broadcast_kv_layout(impl):
    base = make()
    k = np.broadcast_to(base.k[:1], base.k.shape).copy()
    v = np.broadcast_to(base.v[:1], base.v.shape).copy()
    case = base.replace(k=k, v=v, layout="broadcast_kv", dtype="float32")
    assert impl.supports(case) is True
    assert judge_output(impl.run(case).out, case).ok
    uneven = make(layout="broadcast_kv")        # K differs over the batch: not expressible as a broadcast
    assert "equal across the batch" in impl.supports(uneven)


def test_gqa_grouping_is_repeat_interleave(impl):
    """Query heads 0, 1 use KV head 0: giving KV head 1 large values leaves them unchanged."""
    case = make(Hkv=2, dtype="float32")
    k2 = case.k.copy()
    k2[:, 1] = 50.0
    out1, out2 = impl.run(case).out, impl.run(case.replace(k=k2)).out
    assert np.array_equal(out1[:, :2], out2[:, :2])
    assert not np.allclose(out1[:, 2:], out2[:, 2:])


def test_custom_scale_is_exact_or_refused(impl):
    """tinygrad has no scale argument: Q * scale * sqrt(Dk) must be exact in the dtype, else refused."""
    inexact = make(scale=0.3, dtype="float32")
    reason = impl.supports(inexact)
    assert isinstance(reason, str) and "not exact in float32" in reason
    assert isinstance(impl.supports(inexact.replace(dtype="float16")), str)
    assert impl.supports(inexact.replace(dtype="float64")) is True            # analytic bound, see docstring
    exact = make(Dk=16, Dv=16, scale=0.5, dtype="float32")                    # c = 0.5 * 4 = 2: exact
    assert impl.supports(exact) is True
    assert judge_output(impl.run(exact).out, exact).ok
    # the scale really reaches the logits: 2 x scale gives another (correct) answer
    doubled = exact.replace(scale=1.0)
    assert judge_output(impl.run(doubled).out, doubled).ok
    assert not np.allclose(impl.run(exact).out, impl.run(doubled).out)


def test_undeclared_features_are_refused(impl):
    base = make(dtype="float32")
    for change, needs in ((dict(window=(2, 0)), "window_bottom_right"), (dict(softcap=5.0), "softcap"),
                          (dict(alibi_slopes=np.ones(4)), "alibi"), (dict(sinks=np.zeros(4)), "sinks")):
        reason = impl.supports(base.replace(**change))
        assert isinstance(reason, str) and needs in reason, (change, reason)
    assert isinstance(impl.supports(base, need=frozenset({"lse"})), str)
    assert isinstance(impl.supports(base, need=frozenset({"weights"})), str)


def test_bfloat16_declaration_is_honest(impl):
    """bfloat16 is declared exactly when a bfloat16 SDPA compiles and runs on this machine."""
    case = make(dtype="bfloat16")
    declared = impl.supports(case)
    bypass = tga.SdpaAdapter.__new__(tga.SdpaAdapter)      # same adapter, without the declaration
    bypass.device, bypass.dtypes, bypass._unsupported_dtypes = "cpu", tga.DTYPES, {}
    try:
        res = bypass.run(case)
    except adapters.KernelError as exc:
        assert isinstance(declared, str) and "bfloat16" in declared and "__bf16" in declared, declared
        assert "__bf16" in str(exc) or "bf16" in str(exc).lower()
    else:
        assert declared is True
        assert judge_output(res.out, case).ok


def test_gradients_float64(impl):
    case = make(Dk=16, Dv=16, bias=RNG.normal(size=(1, 4, 5, 7)), causal="top_left", scale=0.3, dtype="float64",
                grad_out=RNG.normal(size=(2, 4, 5, 16)))
    res = impl.run(case, grads=True)
    ref = backward(case)
    for name in ("dq", "dk", "dv", "dbias"):
        got, want = res.grads[name], getattr(ref, name)
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()), err_msg=name)


def test_gradients_float32_within_tolerance(impl):
    case = make(Hkv=2, mask=rows_kept(5, 7), dtype="float32", grad_out=RNG.normal(size=(2, 4, 5, 8)))
    for j in judge_gradients(impl.run(case, grads=True).grads, case):
        assert j.ok, j.explain()


def test_dropout_only_in_training_mode(impl):
    """Documented: Tensor.dropout applies only under TRAINING. Outside it dropout_p is ignored; the
    adapter runs dropout cases in training mode, where weights are dropped and rescaled."""
    case = make(Lk=8, Dv=8, dtype="float32")
    q, k, v = (tga.to_tensor(x, "float32") for x in (case.q, case.k, case.v))
    plain = q.scaled_dot_product_attention(k, v).numpy()
    assert np.array_equal(q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy(), plain)
    # one-hot V (Dv = Lk = 8): output entries are the dropped-out weights
    eye = np.broadcast_to(np.eye(8), (2, 4, 8, 8)).copy()
    onehot = make(Lq=5, Lk=8, Dk=8, Dv=8).replace(v=eye, dtype="float32")
    w = oracle(onehot).out
    runs = [impl.run(onehot.replace(dropout_p=0.5, seed=s)).out for s in range(3)]
    assert not np.array_equal(runs[0], runs[1])
    assert np.array_equal(runs[0], impl.run(onehot.replace(dropout_p=0.5, seed=0)).out)   # seeded
    kept = runs[0] != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(runs[0][kept], 2 * w[kept], rtol=1e-5)


def test_invalid_shapes_raise(impl):
    for shapes in (((2, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8)), ((1, 2, 4, 8), (1, 2, 5, 6), (1, 2, 5, 8)),
                   ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8))):
        with pytest.raises(Exception):
            impl.run_raw(*(RNG.normal(size=s) for s in shapes), "float32")


def test_describe_records_the_toolchain(impl):
    d = impl.describe()
    assert d["framework"] == "tinygrad" and d["renderer"] == "CLANG" and d["BEAM"] == 0
    assert d["compiler"] and "scale" in d


def test_missing_compiler_is_one_line_usage_error(monkeypatch):
    saved = dict(tga._STATE)
    tga._STATE.clear()
    monkeypatch.setenv("CC", "/nonexistent/attnconf-cc")
    try:
        with pytest.raises(adapters.UsageError) as info:
            adapters.load("tinygrad")
        msg = str(info.value)
        assert "\n" not in msg and "apt-get install clang" in msg
    finally:
        tga._STATE.update(saved)


# ---- divergences ------------------------------------------------------------
def test_divergence_file_is_valid():
    entries = backend_entries("tinygrad")
    Divergences(entries, "cpu")                      # regions and witnesses exist
    from attnconf.conformance.engine.alternatives import ALTERNATIVES

    vocabulary = set(ALTERNATIVES)
    for e in entries:
        assert e["instead"] in vocabulary or hasattr(alternatives_tinygrad, e["instead"]), e["id"]
        assert e["witness"] in WITNESSES
        if e["kind"] == "bug":
            assert (ROOT / e["link"]).is_file(), e["link"]


def test_empty_rows_are_nan_and_poison_gradients(impl):
    """TINYGRAD-EMPTY-ROWS-NAN and -GRADS on their witness: exactly the NaN pattern the entries declare."""
    case = WITNESSES["fully_masked_row"]()
    out = impl.run(case).out
    rows = regions_tinygrad.nan_rows(case)
    assert rows.sum() == 1
    assert np.isnan(out[rows]).all() and np.isfinite(out[~rows]).all()
    assert judge_output(np.where(rows[..., None], oracle(case).out, out), case).ok     # the other rows conform
    g_case = case.replace(grad_out=RNG.normal(size=case.out_shape))
    grads = impl.run(g_case, grads=True).grads
    expected = alternatives_tinygrad.nan_rows_poison_gradients(g_case)
    for name, g in grads.items():
        assert np.array_equal(np.isnan(g), np.isnan(expected[name])), name
        finite = ~np.isnan(expected[name])
        assert np.allclose(g[finite], expected[name][finite], atol=1e-5), name


def test_poisoned_gradients_with_gqa_and_bias(impl):
    mask = np.ones((2, 4, 5, 7), bool)
    mask[1, 2, 3] = False
    case = make(Hkv=2, mask=mask, bias=RNG.normal(size=(1, 4, 5, 7)), dtype="float32",
                grad_out=RNG.normal(size=(2, 4, 5, 8)))
    grads = impl.run(case, grads=True).grads
    expected = alternatives_tinygrad.nan_rows_poison_gradients(case)
    assert np.isnan(expected["dk"]).sum() == 7 * 8 and np.isnan(expected["dbias"]).sum() == 7
    for name in ("dq", "dk", "dv", "dbias"):
        assert np.array_equal(np.isnan(grads[name]), np.isnan(expected[name])), name


def test_float16_logit_overflow_rows(impl):
    """TINYGRAD-F16-LOGIT-OVERFLOW-NAN: NaN exactly on the rows whose scaled logit rounds to inf in float16."""
    case = witnesses_tinygrad.float16_scaled_logit_overflow()
    rows = regions_tinygrad.float16_scaled_logit_overflow_rows(case)
    assert rows.tolist() == [[[True, False, False]]]
    out = impl.run(case).out
    assert np.isnan(out[rows]).all() and np.isfinite(out[~rows]).all()
    assert judge_output(np.where(rows[..., None], oracle(case).out, out), case).ok
    assert regions_tinygrad.float16_scaled_logit_overflow_rows(case.replace(dtype="float32")) is False
    # just below the threshold the row is finite and accurate
    q = case.q.copy()
    q[0, 0, 0, :] = 125.0                                     # logit 16 * 125 * 130 / 4 = 65000 < 65520
    below = case.replace(q=q)
    assert not regions_tinygrad.float16_scaled_logit_overflow_rows(below).any()
    assert judge_output(impl.run(below).out, below).ok


def test_finding_reproduction_runs():
    script = ROOT / "adapters" / "tinygrad" / "findings" / "TINYGRAD-SDPA-EMPTY-ROW-NAN.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    if proc.returncode == 2:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.stdout.strip().splitlines()[-1].startswith("REPRODUCED: ")



def _explicit_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """A third-party tinygrad kernel in the SDPA convention (scale handled by pre-scaling Q)."""
    d = query.shape[-1]
    if scale is not None:
        query = query * (scale * math.sqrt(d))
    return query.scaled_dot_product_attention(key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, enable_gqa=enable_gqa)


def test_kernel_adapter_wraps_a_tinygrad_function(impl):
    a = tga.kernel_adapter(_explicit_sdpa, "cpu", "tinygrad:kernel:test")
    assert a.dtypes == impl.dtypes
    case = make(mask=rows_kept(5, 7), Hkv=2, dtype="float32")
    res = a.run(case)
    assert res.out_dtype == "float32"
    assert judge_output(res.out, case).ok
