"""The JAX adapter: translation of every Case feature, x64, the flax layer, the kernel wrapper."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

from attnconf import adapters  # noqa: E402
from attnconf.adapters.jax import XlaAdapter, check_kernel_signature, kernel_adapter  # noqa: E402
from attnconf.adapters.jax.translate import translate  # noqa: E402
from attnconf.reference import Case, oracle  # noqa: E402
from attnconf.reference.backward import backward  # noqa: E402

RNG = np.random.default_rng(7)


def qkv(b=2, hq=4, hkv=4, lq=5, lk=7, d=8):
    return (RNG.standard_normal((b, hq, lq, d)), RNG.standard_normal((b, hkv, lk, d)),
            RNG.standard_normal((b, hkv, lk, d)))


def visible_rows_err(res, case):
    f = oracle(case)
    rows = f.visible.any(-1)
    return float(np.abs(res.out - f.out)[rows].max())


CASES = {
    "plain": dict(),
    "mask": dict(mask=RNG.random((2, 1, 5, 7)) > 0.3),
    "bias": dict(bias=RNG.standard_normal((1, 4, 5, 7))),
    "mask+bias+causal_tl": dict(mask=RNG.random((2, 4, 5, 7)) > 0.2, bias=RNG.standard_normal((5, 7)),
                                causal="top_left"),
    "causal_br": dict(causal="bottom_right"),
    "lengths+causal_br": dict(q_lengths=[5, 2], kv_lengths=[3, 7], causal="bottom_right"),
    "scale": dict(scale=0.37),
}


@pytest.fixture(scope="module")
def xla():
    return XlaAdapter("cpu", {})


@pytest.mark.parametrize("name", list(CASES))
def test_xla_matches_reference_float32(xla, name):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype="float32", **CASES[name])
    assert xla.supports(case) is True
    res = xla.run(case)
    assert res.out_dtype == "float32" and res.out.shape == case.out_shape
    assert visible_rows_err(res, case) < 5e-6


def test_gqa_grouping_is_repeat_interleave(xla):
    q, k, v = qkv(hq=6, hkv=2, lq=7)
    case = Case.build(q, k, v, dtype="float32")
    res = xla.run(case)
    assert np.abs(res.out - oracle(case).out).max() < 5e-6
    tiled = Case.build(q, np.tile(k, (1, 3, 1, 1)), np.tile(v, (1, 3, 1, 1)), dtype="float32")
    assert np.abs(res.out - oracle(tiled).out).max() > 1e-2   # the other grouping would be caught


def test_translation_uses_native_arguments_where_exact():
    q, k, v = qkv(lq=7)
    call = translate(Case.build(q, k, v, causal="bottom_right"))   # Lq == Lk: same as top-left
    assert call.is_causal and call.mask is None
    q, k, v = qkv()
    call = translate(Case.build(q, k, v, causal="bottom_right", kv_lengths=[7, 4]))
    assert not call.is_causal and call.mask.shape == (2, 1, 5, 7) and call.kv_lengths.dtype == np.int32
    assert call.q.shape == (2, 5, 4, 8)   # BTNH


def test_float64_runs_with_x64_and_is_float32_accurate(xla):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype="float64")
    res = xla.run(case)
    assert xla.describe()["jax_enable_x64"] is True and res.out_dtype == "float64"
    err = visible_rows_err(res, case)
    assert 1e-9 < err < 1e-5   # JAX-XLA-FLOAT64-SOFTMAX-F32: softmax in float32


def test_float16_on_cpu_runs_eagerly(xla):
    q, k, v = qkv()
    res = xla.run(Case.build(q, k, v, dtype="float16", causal="top_left"))
    assert res.out_dtype == "float16" and "eager" in res.notes


def test_float16_on_cpu_compiles_the_op_by_op_fallback_bit_for_bit():
    """The compiled fallback graph equals the op-by-op call (the only float16 path users have on CPU) bit
    for bit: the adapter compares its first calls, and here every one, lse included."""
    from attnconf.adapters.jax import adapter as jax_adapter

    fresh = XlaAdapter("cpu", {})
    for i, params in enumerate(CASES.values()):
        q, k, v = qkv()
        case = Case.build(q, k, v, dtype="float16", **params)
        args, static = fresh.jax_arguments(case, translate(case))
        with jax_adapter._trace_time_fallback() as replaced:
            assert replaced, "this JAX's attention no longer holds jnp_einsum: the float16 fast path is off"
            fast = jax_adapter._attend_f16_cpu(*args, **static, residual=True)
        slow = jax_adapter._attend(*args, **static, residual=True)
        for a, b in zip(fast, slow):
            assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), list(CASES)[i]
        res = fresh.run(case)
        assert res.out_dtype == "float16" and "bitwise equal" in res.notes["eager"]
    assert fresh._f16_compiled_ok and fresh._f16_verified == jax_adapter.F16_VERIFY_FIRST


def test_float16_on_cpu_goes_op_by_op_when_the_compiled_graph_differs(monkeypatch):
    from attnconf.adapters.jax import adapter as jax_adapter

    real = jax_adapter._attend_f16_cpu
    monkeypatch.setattr(jax_adapter, "_attend_f16_cpu",
                        lambda *a, **kw: jax.tree_util.tree_map(lambda x: x * 1.5, real(*a, **kw)))
    fresh = XlaAdapter("cpu", {})
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype="float16")
    res = fresh.run(case)
    assert not fresh._f16_compiled_ok and "differed" in res.notes["eager"]
    assert visible_rows_err(res, case) < 5e-3                      # the op-by-op answer, not the scaled one
    again = fresh.run(case)
    assert np.array_equal(again.out, res.out) and "op by op, as it must" in again.notes["eager"]


def test_fully_masked_row_outputs_mean_of_v(xla):
    q, k, v = qkv(b=1, hq=1, hkv=1, lq=4, lk=6)
    mask = np.ones((1, 1, 4, 6), bool)
    mask[..., 1, :] = False
    res = xla.run(Case.build(q, k, v, mask=mask, dtype="float32"))
    np.testing.assert_allclose(res.out[0, 0, 1], v[0, 0].mean(0), atol=1e-5)   # JAX-XLA-EMPTY-MEAN
    assert res.lse[0, 0, 1] < -1e38                                           # JAX-XLA-EMPTY-LSE


def test_padded_query_rows_are_zero(xla):
    q, k, v = qkv()
    res = xla.run(Case.build(q, k, v, q_lengths=[5, 2], dtype="float32"))
    assert (res.out[1, :, 2:] == 0).all()


def test_grads_and_dbias(xla):
    q, k, v = qkv(hq=4, hkv=2)
    case = Case.build(q, k, v, bias=RNG.standard_normal((1, 4, 5, 7)), causal="top_left", dtype="float32",
                      grad_out=RNG.standard_normal((2, 4, 5, 8)))
    res = xla.run(case, grads=True)
    ref = backward(case)
    for n in ("dq", "dk", "dv", "dbias"):
        assert res.grads[n].shape == getattr(ref, n).shape
        assert np.abs(res.grads[n] - getattr(ref, n)).max() < 1e-5, n


def test_dv_ne_dk_is_unsupported(xla):
    q, k, _ = qkv()
    case = Case.build(q, k, RNG.standard_normal((2, 4, 7, 3)))
    assert "head dim" in xla.supports(case)


def test_implementations_on_cpu():
    names = [a.name for a in adapters.load("jax")]
    assert names == ["jax:xla", "jax:flax-mha"]


def test_flax_layer_matches_reference_mha():
    layer = pytest.importorskip("attnconf.reference.layer")
    from attnconf.adapters.jax.layer import FlaxMhaAdapter

    B, Lq, Lk, E, H = 2, 5, 6, 12, 3
    r = lambda *s: RNG.standard_normal(s) * 0.5  # noqa: E731
    mask = RNG.random((B, Lq, Lk)) > 0.3
    mask[..., 0] = True
    for params in (dict(b_q=r(E), b_o=r(E), mask=mask), dict(causal="top_left")):
        lq = Lk if params.get("causal") else Lq
        lc = layer.LayerCase.build(r(B, lq, E), r(B, Lk, E), r(B, Lk, E), r(E, E), r(E, E), r(E, E), r(E, E),
                                   num_heads=H, dtype="float32", **params)
        ad = FlaxMhaAdapter("cpu", {})
        assert ad.kind == "layer" and ad.supports_layer(lc) is True
        assert np.abs(ad.run_layer(lc) - layer.mha(lc)).max() < 1e-5


def test_kernel_wrapper_with_jax_itself():
    fn = jax.nn.dot_product_attention
    assert check_kernel_signature(fn) is None
    assert "does not take" in check_kernel_signature(lambda q, k, v, attn_mask=None: q)
    ad = kernel_adapter(fn, "cpu", "jax:kernel:jax.nn:dot_product_attention")
    for name in ("mask+bias+causal_tl", "lengths+causal_br"):
        q, k, v = qkv()
        case = Case.build(q, k, v, dtype="float32", **CASES[name])
        assert visible_rows_err(ad.run(case), case) < 5e-6
    q, k, v = qkv(hq=4, hkv=1)
    case = Case.build(q, k, v, dtype="float32")
    assert np.abs(ad.run(case).out - oracle(case).out).max() < 5e-6


def test_kernel_wrapper_rejects_bad_returns():
    from attnconf.adapters.base import KernelError

    ad = kernel_adapter(lambda q, k, v, bias=None, mask=None, **kw: np.zeros(3), "cpu", "jax:kernel:bad")
    q, k, v = qkv()
    with pytest.raises(KernelError):
        ad.run(Case.build(q, k, v, dtype="float32"))


# ---- JAX-convention kernels: local_window_size and gradients -------------------------------------
def _kernel(name: str):
    return adapters.load("jax", kernel=f"tests.kernels.jax_kernels:{name}")[0]


def _wcase(window, align="top_left", *, hq=4, hkv=2, lq=7, lk=9, d=8, dtype="float32", seed=3, **kw):
    rng = np.random.default_rng(seed)
    return Case.build(rng.standard_normal((2, hq, lq, d)), rng.standard_normal((2, hkv, lk, d)),
                      rng.standard_normal((2, hkv, lk, d)), grad_out=rng.standard_normal((2, hq, lq, d)),
                      window=window, window_align=align, dtype=dtype, **kw)


def test_kernel_local_window_size_is_jax_top_left_window():
    ad = _kernel("attention")
    assert {"window_top_left", "grads", "dbias"} <= ad.capabilities and "window_bottom_right" not in ad.capabilities
    # top-left: passed as it is; -1 becomes the bound that never binds (jax gives -1 no meaning)
    assert ad.arguments(_wcase((2, 1)))[1]["local_window_size"] == (2, 1)
    assert ad.arguments(_wcase((-1, 0)))[1]["local_window_size"] == (6, 0)      # Lq - 1
    assert ad.arguments(_wcase((3, -1)))[1]["local_window_size"] == (3, 8)      # Lk - 1
    assert "local_window_size" not in ad.arguments(_wcase((-1, -1)))[1]
    assert "local_window_size" not in ad.arguments(_wcase(None))[1]
    # bottom-right with offset 0 in every batch element is the same window; with another offset it is outside
    same = _wcase((1, 2), "bottom_right", lk=7, q_lengths=[7, 0], kv_lengths=[7, 5])
    assert ad.supports(same) is True and ad.arguments(same)[1]["local_window_size"] == (1, 2)
    assert "lacks window_bottom_right" in ad.supports(_wcase((1, 2), "bottom_right"))
    # jax.nn.dot_product_attention itself agrees: the translation is exact on the rows it defines
    for case in (_wcase((2, 1)), _wcase((0, 3), causal="bottom_right"), same):
        f = oracle(case)
        rows = f.visible.any(-1)
        xla = kernel_adapter(jax.nn.dot_product_attention, "cpu", "jax:kernel:jax.nn").run(case)
        assert np.abs(xla.out - f.out)[rows].max() < 5e-6


def test_correct_kernel_passes_window_and_gradient_cases():
    from attnconf.conformance.engine.tolerance import judge_gradients, judge_output

    ad = _kernel("attention")
    assert ad.scope()["grads"] and ad.scope()["source"] == "full jax convention (no declaration)"
    rng = np.random.default_rng(5)
    cases = [_wcase((2, 1)), _wcase((1, -1), causal="top_left", kv_lengths=[9, 4], q_lengths=[7, 3]),
             _wcase((0, 2), bias=rng.standard_normal((2, 4, 7, 9)), dtype="float64"),
             _wcase((-1, 0), lq=9, lk=4, dtype="bfloat16", mask=rng.random((2, 1, 9, 4)) > 0.3),   # empty rows
             _wcase(None, bias=rng.standard_normal((1, 4, 7, 9)), causal="bottom_right")]
    for case in cases:
        assert ad.supports(case, need={"grads"}) is True
        res = ad.run(case, grads=True)
        assert judge_output(res.out, case).ok, case.summary()
        assert set(res.grads) == ({"dq", "dk", "dv"} | ({"dbias"} if case.bias is not None else set()))
        assert res.grads["dk"].shape == case.k.shape and res.grads["dbias" if case.bias is not None else "dv"].shape \
            == (case.bias.shape if case.bias is not None else case.v.shape)
        judged = judge_gradients(res.grads, case)
        assert len(judged) == len(res.grads) and all(j.ok for j in judged), (case.summary(), judged)


def test_kernel_that_ignores_local_window_size_is_caught():
    from attnconf.conformance.engine.tolerance import judge_output

    witness = _wcase((1, 0))
    assert judge_output(_kernel("attention").run(witness).out, witness).ok
    assert not judge_output(_kernel("ignores_window").run(witness).out, witness).ok


def test_kernel_with_a_wrong_custom_vjp_dq_is_caught():
    from attnconf.conformance.engine.tolerance import judge_gradients, judge_output

    witness = _wcase((2, 1))
    res = _kernel("wrong_dq").run(witness, grads=True)
    assert judge_output(res.out, witness).ok                              # the forward is right
    ok = {j.quantity: j.ok for j in judge_gradients(res.grads, witness)}
    assert ok == {"dq": False, "dk": True, "dv": True}


def test_forward_only_kernel_declares_no_grads(tmp_path):
    from attnconf.adapters import scope
    from attnconf.adapters.base import KernelError

    ad = _kernel("forward_only")
    case = _wcase((2, 1))
    assert "grads" not in ad.capabilities and "grads" in ad.supports(case, need={"grads"})
    assert ad.supports(case) is True and np.abs(ad.run(case).out - oracle(case).out).max() < 5e-6
    assert "forward only" in scope.scope_sentence(ad.scope())
    undeclared = kernel_adapter(ad.fn, "cpu", "jax:kernel:undeclared")      # full scope: grads asked, and fail
    with pytest.raises(KernelError, match="backward"):
        undeclared.run(case, grads=True)
    decl = tmp_path / "scope.toml"
    decl.write_text('grads = false\nfeatures = ["window_top_left", "gqa", "cross"]\n')
    narrow = adapters.load("jax", kernel="tests.kernels.jax_kernels:attention", capabilities=str(decl))[0]
    assert narrow.capabilities == {"window_top_left", "gqa", "cross"}
    decl.write_text('features = ["window_bottom_right"]\n')
    with pytest.raises(adapters.UsageError, match="cannot express window_bottom_right"):
        adapters.load("jax", kernel="tests.kernels.jax_kernels:attention", capabilities=str(decl))
