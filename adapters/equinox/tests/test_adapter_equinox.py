"""The equinox backend: equinox.nn.MultiheadAttention (equinox:mha) and the per-head function it calls
(equinox:dpa): how a Case is mapped, that the declared scope is honest, and that each divergence's
witness shows its behaviour."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine.divergences import backend_entries  # noqa: E402
from attnconf.adapters.equinox import EqxDpaAdapter  # noqa: E402
from attnconf.adapters.equinox.layer import EqxMhaAdapter  # noqa: E402
from tests.masked_logits import masked_logits_constant  # noqa: E402
from attnconf.conformance.engine.tolerance import judge_gradients, judge_layer, judge_output  # noqa: E402
from attnconf.conformance.engine.witnesses import WITNESSES  # noqa: E402
from attnconf.reference import Case, numpy_dtype, oracle  # noqa: E402
from attnconf.reference.backward import backward  # noqa: E402
from attnconf.reference.layer import LayerCase, mha, random_layer_case  # noqa: E402

RNG = np.random.default_rng(12)


def qkv(b=2, hq=3, hkv=3, lq=5, lk=7, d=16, dv=None):
    return (RNG.standard_normal((b, hq, lq, d)), RNG.standard_normal((b, hkv, lk, d)),
            RNG.standard_normal((b, hkv, lk, dv or d)))


def close(got, want, case) -> bool:
    """|got - want| within the rounding of sums of Lk and Dk terms at the case's dtype:
    8 (Lk + Dk) eps(dtype) max(1, |want|)."""
    s = case.shape
    eps = float(np.finfo(numpy_dtype(case.dtype)).eps)
    bound = 8 * (s["Lk"] + s["Dk"]) * eps * max(1.0, float(np.abs(want).max(initial=0.0)))
    return float(np.abs(got - want).max(initial=0.0)) <= bound


def conforms_off_empty_rows(out, case) -> bool:
    """The tolerance model's verdict on every row that sees a key (empty rows are the divergence tests')."""
    f = oracle(case)
    empty = ~f.visible.any(-1)
    return judge_output(np.where(empty[..., None], f.out, out), case).ok


CASES = {
    "plain": dict(),
    "mask": dict(mask=RNG.random((2, 1, 5, 7)) > 0.3),
    "mask+causal_tl": dict(mask=RNG.random((2, 3, 5, 7)) > 0.2, causal="top_left"),
    "causal_br": dict(causal="bottom_right"),
    "lengths+causal_br": dict(q_lengths=[5, 2], kv_lengths=[3, 7], causal="bottom_right"),
    "scale": dict(scale=0.125),
}


@pytest.fixture(scope="module")
def dpa():
    return EqxDpaAdapter("cpu", {})


def test_implementations_and_no_kernel_convention():
    assert [a.name for a in adapters.load("equinox")] == ["equinox:dpa", "equinox:mha"]
    with pytest.raises(adapters.UsageError, match="no kernel calling convention"):
        adapters.load("equinox", kernel="equinox.nn:MultiheadAttention")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["float64", "float32"])   # half precision: test_half_precision*
def test_dpa_matches_reference(dpa, name, dtype):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype=dtype, **CASES[name])
    assert dpa.supports(case) is True
    res = dpa.run(case)
    assert res.out_dtype == dtype and res.out.shape == case.out_shape
    assert conforms_off_empty_rows(res.out, case)


def test_custom_scale_is_not_dropped(dpa):
    q, k, v = qkv()
    res = dpa.run(Case.build(q, k, v, dtype="float32", scale=2.0))
    assert "driven through Q" in res.notes["scale"]
    assert np.abs(res.out - oracle(Case.build(q, k, v, dtype="float32")).out).max() > 0.1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(dpa, dtype):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype=dtype, causal="top_left")
    res = dpa.run(case)
    assert res.out_dtype == dtype and judge_output(res.out, case).ok


@pytest.mark.parametrize("params,missing", [
    (dict(bias=np.zeros((5, 7))), "bias"), (dict(window=(2, 0)), "window_bottom_right"),
    (dict(softcap=5.0), "softcap"), (dict(sinks=np.zeros(3)), "sinks"),
    (dict(layout="broadcast_kv"), "broadcast_kv")])
def test_outside_scope_is_refused_with_a_reason(dpa, params, missing):
    q, k, v = qkv()
    assert missing in dpa.supports(Case.build(q, k, v, **params))


def test_gqa_is_refused(dpa):
    q, k, v = qkv(hq=6, hkv=2)
    assert "gqa" in dpa.supports(Case.build(q, k, v))


def test_gradients(dpa):
    q, k, v = qkv(dv=5)
    case = Case.build(q, k, v, causal="bottom_right", kv_lengths=[7, 6], dtype="float64", scale=0.5,
                      grad_out=RNG.standard_normal((2, 3, 5, 5)))
    res = dpa.run(case, grads=True)
    assert set(res.grads) == {"dq", "dk", "dv"}
    assert all(j.ok for j in judge_gradients(res.grads, case))


def test_fully_masked_rows_are_the_mean_of_v(dpa):
    """EQX-EMPTY-MEAN / EQX-EMPTY-GRADS: no bias, so every empty row is the mean of all Lk value rows
    (the vocabulary's mean_of_values), and equals the flax alternative too."""
    q, k, v = qkv(b=1, hq=1, hkv=1, lq=4, lk=5, d=8)
    mask = np.ones((1, 1, 4, 5), dtype=bool)
    mask[..., 1, :] = False
    case = Case.build(q, k, v, mask=mask, q_lengths=[3], dtype="float64", grad_out=RNG.standard_normal((1, 1, 4, 8)))
    res = dpa.run(case, grads=True)
    assert close(res.out[0, 0, [1, 3]], np.broadcast_to(v[0, 0].mean(0), (2, 8)), case)
    alt = masked_logits_constant(case)
    for name in ("out", "dq", "dk", "dv"):
        got = res.out if name == "out" else res.grads[name]
        assert close(got, alt[name], case), name
    assert (res.grads["dq"][0, 0, [1, 3]] == 0).all()


def _diverges(adapter, entry) -> bool:
    """The witness of `entry` departs from the spec on `adapter` (the project's own check, in small)."""
    from attnconf.adapters.flax import witnesses as witnesses_flax  # noqa: F401  (registers the backend's witnesses)

    case = WITNESSES[entry["witness"]]()
    if adapter.kind == "layer":
        lc = random_layer_case(np.random.default_rng(0), case.shape["B"], case.shape["Lq"], case.shape["Lk"],
                               8 * case.shape["Hq"], case.shape["Hq"], dtype=case.dtype,
                               mask=oracle(case).visible[:, 0])
        return not judge_layer(adapter.run_layer(lc), lc).ok
    grads = entry["scope"] == "gradients"
    if grads:
        case = case.replace(grad_out=np.random.default_rng(0).normal(size=case.out_shape))
    res = adapter.run(case, grads=grads)
    if res.out_dtype != case.dtype:
        return True
    if grads:
        return not all(j.ok for j in judge_gradients(res.grads, case))
    return not judge_output(res.out, case).ok


def test_every_witness_diverges():
    from fnmatch import fnmatch

    entries = backend_entries("equinox")
    assert entries
    for adapter in adapters.load("equinox"):
        for e in entries:
            if any(fnmatch(adapter.name, pat) for pat in e["implementations"]):
                assert _diverges(adapter, e), (adapter.name, e["id"])


def test_layer_witness_diverges():
    case = WITNESSES["fully_masked_row"]()
    lc = random_layer_case(np.random.default_rng(0), 1, 4, 6, 8, 1, dtype="float32", mask=oracle(case).visible[:, 0])
    assert not judge_layer(EqxMhaAdapter("cpu", {}).run_layer(lc), lc).ok


def test_dropout(dpa):
    q, k = 0.5 * RNG.standard_normal((1, 4, 8, 8)), 0.5 * RNG.standard_normal((1, 4, 8, 8))
    v = np.broadcast_to(np.eye(8), (1, 4, 8, 8)).copy()
    case = Case.build(q, k, v, dtype="float32", dropout_p=0.25, seed=5)
    out = dpa.run(case).out
    w = oracle(case.replace(dropout_p=0.0)).out
    kept = out != 0
    assert close(out[kept], (w / 0.75)[kept], case)
    assert 0 < kept.mean() < 1
    assert (dpa.run(case.replace(seed=6)).out != out).any()


def test_layer_maps_weights_and_per_projection_biases():
    layer = EqxMhaAdapter("cpu", {})
    B, Lq, Lk, E, H = 2, 5, 6, 12, 3
    r = lambda *s: RNG.standard_normal(s) * 0.5  # noqa: E731
    mask = RNG.random((B, Lq, Lk)) > 0.3
    mask[..., 0] = True
    for params in (dict(b_q=r(E), b_o=r(E), mask=mask), dict(causal="top_left"), dict(b_k=r(E), b_v=r(E))):
        lq = Lk if params.get("causal") else Lq
        lc = LayerCase.build(r(B, lq, E), r(B, Lk, E), r(B, Lk, E), r(E, E), r(E, E), r(E, E), r(E, E),
                             num_heads=H, dtype="float64", **params)
        m = layer.module(lc)
        assert m.use_query_bias == ("b_q" in params) and m.use_value_bias == ("b_v" in params)
        assert layer.supports_layer(lc) is True
        assert judge_layer(layer.run_layer(lc), lc).ok
    assert not hasattr(layer, "supports") and not hasattr(layer, "run")   # the layer protocol only


def test_float16_visible_overflow_witness(dpa):
    from attnconf.adapters.flax import regions as regions_flax, witnesses as witnesses_flax  # noqa: F401

    case = WITNESSES["float16_visible_logit_overflow"]()
    assert bool(regions_flax.float16_logit_overflow_rows(case))
    out = dpa.run(case).out
    assert np.isnan(out).all() and np.isfinite(oracle(case).out).all()       # EQX-F16-LOGIT-OVERFLOW
