"""The flax backend: flax.linen.dot_product_attention (flax:linen-dpa) and MultiHeadDotProductAttention
(flax:linen-mha): how a Case is mapped, that the declared scope is honest, and that each divergence's
witness shows its behaviour."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import flax.linen as nn  # noqa: E402

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine.divergences import backend_entries  # noqa: E402
from attnconf.adapters.flax import LinenDpaAdapter, check_kernel_signature, kernel_adapter  # noqa: E402
from attnconf.adapters.flax.layer import LinenMhaAdapter  # noqa: E402
from tests.masked_logits import masked_logits_constant  # noqa: E402
from attnconf.conformance.engine.tolerance import judge_gradients, judge_layer, judge_output  # noqa: E402
from attnconf.conformance.engine.witnesses import WITNESSES  # noqa: E402
from attnconf.reference import Case, numpy_dtype, oracle  # noqa: E402
from attnconf.reference.backward import backward  # noqa: E402
from attnconf.reference.layer import LayerCase, mha, random_layer_case  # noqa: E402

RNG = np.random.default_rng(11)


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
    "bias": dict(bias=RNG.standard_normal((1, 3, 5, 7))),
    "mask+bias+causal_tl": dict(mask=RNG.random((2, 3, 5, 7)) > 0.2, bias=RNG.standard_normal((5, 7)),
                                causal="top_left"),
    "causal_br": dict(causal="bottom_right"),
    "lengths+causal_br": dict(q_lengths=[5, 2], kv_lengths=[3, 7], causal="bottom_right"),
    "kv_lengths": dict(kv_lengths=[7, 1]),
    "scale": dict(scale=0.125),
    "negative_scale+causal": dict(scale=-0.5, causal="top_left"),
}


@pytest.fixture(scope="module")
def dpa():
    return LinenDpaAdapter("cpu", {})


def test_implementations_and_install_hint():
    # force_fp32_for_softmax=True is opt-in (registry.py): named with --impl, and a job of its own in `make report`
    assert [a.name for a in adapters.load("flax")] == ["flax:linen-dpa", "flax:linen-mha"]
    assert [a.name for a in adapters.load("flax", impl="flax:linen-dpa-fp32-softmax")] == ["flax:linen-dpa-fp32-softmax"]
    assert "flax" in adapters.BACKENDS["flax"].install_hint
    with pytest.raises(adapters.UsageError, match="unknown --impl"):
        adapters.load("flax", impl="flax:nope")


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["float64", "float32"])   # half precision: test_half_precision*
def test_dpa_matches_reference(dpa, name, dtype):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype=dtype, **CASES[name])
    assert dpa.supports(case) is True
    res = dpa.run(case)
    assert res.out_dtype == dtype and res.out.shape == case.out_shape
    assert conforms_off_empty_rows(res.out, case)   # float64 is float64-accurate (unlike jax.nn.dot_product_attention)


def test_dv_ne_dk_and_cross(dpa):
    q, k, v = qkv(lq=3, lk=9, dv=5)
    case = Case.build(q, k, v, dtype="float32", causal="top_left")
    assert dpa.supports(case) is True
    assert conforms_off_empty_rows(dpa.run(case).out, case)


def test_custom_scale_goes_through_q_and_is_not_dropped(dpa):
    q, k, v = qkv()
    scaled = Case.build(q, k, v, dtype="float32", scale=2.0)
    res = dpa.run(scaled)
    assert "driven through Q" in res.notes["scale"]
    assert conforms_off_empty_rows(res.out, scaled)
    plain = oracle(Case.build(q, k, v, dtype="float32")).out
    assert np.abs(res.out - plain).max() > 0.1          # a dropped scale would be caught


def test_custom_scale_is_run_only_where_the_translation_is_exact(dpa):
    q, k, v = qkv()                                     # Dk = 16: flax divides by 4
    assert dpa.supports(Case.build(q, k, v, dtype="float16", scale=0.125)) is True   # Q * 0.5: exact
    assert "not a power of two" in dpa.supports(Case.build(q, k, v, dtype="float16", scale=0.37))
    q[0, 0, 0, 0] = 60000.0
    assert "not exact in float16" in dpa.supports(Case.build(q, k, v, dtype="float16", scale=2.0))   # overflow
    q, k, v = qkv(d=8)                                  # sqrt(8) rounds in float16: c = 0.5 * 2.828125
    assert "not a power of two" in dpa.supports(Case.build(q, k, v, dtype="float16", scale=0.5))


def test_make_causal_mask_is_top_left():
    m = np.asarray(nn.make_causal_mask(np.zeros((1, 5))))
    assert m.shape == (1, 1, 5, 5) and (m[0, 0] == np.tril(np.ones((5, 5)))).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_runs_under_jit(dpa, dtype):
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype=dtype, causal="top_left", bias=RNG.standard_normal((5, 7)))
    res = dpa.run(case)
    assert res.out_dtype == dtype and judge_output(res.out, case).ok


@pytest.mark.parametrize("params,missing", [
    (dict(window=(2, 0)), "window_bottom_right"), (dict(softcap=5.0), "softcap"),
    (dict(alibi_slopes=np.ones(3)), "alibi"), (dict(sinks=np.zeros(3)), "sinks"),
    (dict(layout="noncontiguous"), "noncontiguous")])
def test_outside_scope_is_refused_with_a_reason(dpa, params, missing):
    q, k, v = qkv()
    assert missing in dpa.supports(Case.build(q, k, v, **params))


def test_gqa_is_refused_and_really_unsupported(dpa):
    q, k, v = qkv(hq=4, hkv=2)
    case = Case.build(q, k, v, dtype="float32")
    assert "gqa" in dpa.supports(case)
    with pytest.raises(AssertionError, match="num_heads must match"):   # what flax does with GQA shapes
        nn.dot_product_attention(*(np.swapaxes(x, 1, 2).astype(np.float32) for x in (q, k, v)))


def test_gradients_and_dbias(dpa):
    q, k, v = qkv()
    case = Case.build(q, k, v, bias=RNG.standard_normal((1, 3, 5, 7)), causal="top_left", dtype="float64",
                      scale=0.5, grad_out=RNG.standard_normal((2, 3, 5, 16)))
    res = dpa.run(case, grads=True)
    ref = backward(case)
    for n in ("dq", "dk", "dv", "dbias"):
        assert res.grads[n].shape == getattr(ref, n).shape
    assert all(j.ok for j in judge_gradients(res.grads, case))


def _mixed_empty_rows_case(dtype="float64", nan_row=True):
    """Row 0 ordinary; row 1 masked whole, with -inf bias on two of its keys; row 2 emptied by -inf
    bias alone (or ordinary, without `nan_row`); row 3 sees only keys 0 and 1."""
    q, k, v = qkv(b=1, hq=1, hkv=1, lq=4, lk=5, d=8)
    mask = np.ones((1, 1, 4, 5), dtype=bool)
    mask[..., 1, :] = False
    mask[..., 3, 2:] = False
    bias = np.zeros((1, 1, 4, 5))
    bias[..., 1, :2] = -np.inf
    if nan_row:
        bias[..., 2, :] = -np.inf
    return Case.build(q, k, v, mask=mask, bias=bias, dtype=dtype, grad_out=RNG.standard_normal((1, 1, 4, 8)))


@pytest.mark.parametrize("nan_row", [True, False])
def test_fully_masked_rows_follow_the_declared_alternative(dpa, nan_row):
    """FLAX-LINEN-EMPTY-CONSTANT / -GRADS: mask-emptied rows are the mean of V over the mask-hidden keys
    (-inf-bias ones included), bias-emptied rows are NaN; adapters/flax/alternatives.py says so exactly."""
    case = _mixed_empty_rows_case(nan_row=nan_row)
    res = dpa.run(case, grads=True)
    v = case.v[0, 0]
    assert close(res.out[0, 0, 1], v.mean(0), case)
    assert np.isnan(res.out[0, 0, 2]).all() == nan_row
    assert close(res.out[0, 0, [0, 3]], oracle(case).out[0, 0, [0, 3]], case)
    alt = masked_logits_constant(case)
    for name in ("out", "dq", "dk", "dv", "dbias"):
        got, want = (res.out if name == "out" else res.grads[name]), alt[name]
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all(), name
        assert close(got[~nan], want[~nan], case), name
    if nan_row:      # row 2's NaN spreads over every dK and dV row; row 1's dQ stays 0
        assert np.isnan(alt["dv"]).all() and (alt["dq"][0, 0, 1] == 0).all()
    else:            # row 1's uniform weights send dO/5 into every dV row (all five keys are mask-hidden)
        assert np.isfinite(alt["dv"]).all() and (res.grads["dq"][0, 0, 1] == 0).all()


def test_padded_query_rows_are_masked_whole(dpa):
    q, k, v = qkv(b=1)
    case = Case.build(q, k, v, q_lengths=[3], dtype="float64")
    res = dpa.run(case)
    assert close(res.out[0, :, 3:], np.broadcast_to(v[0].mean(1)[:, None], (3, 2, 16)), case)


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

    entries = backend_entries("flax")
    assert entries
    for adapter in adapters.load("flax"):
        for e in entries:
            if any(fnmatch(adapter.name, pat) for pat in e["implementations"]):
                assert _diverges(adapter, e), (adapter.name, e["id"])


def test_layer_witness_diverges():
    case = WITNESSES["fully_masked_row"]()
    vis = oracle(case).visible[:, 0]
    lc = random_layer_case(np.random.default_rng(0), 1, 4, 6, 8, 1, dtype="float32", mask=vis)
    from attnconf.conformance.engine.tolerance import judge_layer

    assert not judge_layer(LinenMhaAdapter("cpu", {}).run_layer(lc), lc).ok


def test_dropout_is_independent_across_heads_and_rescaled(dpa):
    q, k = 0.5 * RNG.standard_normal((1, 4, 8, 8)), 0.5 * RNG.standard_normal((1, 4, 8, 8))
    v = np.broadcast_to(np.eye(8), (1, 4, 8, 8)).copy()
    case = Case.build(q, k, v, dtype="float32", dropout_p=0.5, seed=3)
    out = dpa.run(case).out
    w = oracle(case.replace(dropout_p=0.0)).out
    kept = out != 0
    assert close(out[kept], (w / 0.5)[kept], case)
    assert not all((kept[0, h] == kept[0, 0]).all() for h in range(1, 4))   # broadcast_dropout=False
    assert (dpa.run(case).out == out).all()                                    # the seed decides
    assert (dpa.run(case.replace(seed=4)).out != out).any()


def test_default_broadcast_dropout_shares_the_keep_mask():
    """Why the adapter passes broadcast_dropout=False: flax's default shares one mask over batch and heads."""
    import jax.numpy as jnp

    q = jnp.asarray(RNG.standard_normal((2, 8, 4, 8)), jnp.float32)
    w = nn.dot_product_attention_weights(q, q, dropout_rng=jax.random.key(0), dropout_rate=0.5,
                                         deterministic=False)
    kept = np.asarray(w) != 0
    assert all((kept[b, h] == kept[0, 0]).all() for b in range(2) for h in range(4))


def test_linen_mha_matches_reference_mha():
    layer = LinenMhaAdapter("cpu", {})
    B, Lq, Lk, E, H = 2, 5, 6, 12, 3
    r = lambda *s: RNG.standard_normal(s) * 0.5  # noqa: E731
    mask = RNG.random((B, Lq, Lk)) > 0.3
    mask[..., 0] = True
    for params in (dict(b_q=r(E), b_o=r(E), mask=mask), dict(causal="top_left"), dict(b_v=r(E), causal="top_left")):
        lq = Lk if params.get("causal") else Lq
        lc = LayerCase.build(r(B, lq, E), r(B, Lk, E), r(B, Lk, E), r(E, E), r(E, E), r(E, E), r(E, E),
                             num_heads=H, dtype="float64", **params)
        assert layer.kind == "layer" and layer.supports_layer(lc) is True
        assert judge_layer(layer.run_layer(lc), lc).ok
    assert not hasattr(layer, "supports") and not hasattr(layer, "run")   # the layer protocol only


def test_kernel_convention_is_flax_attention_fn():
    assert check_kernel_signature(nn.dot_product_attention) is None
    assert "attention_fn" in check_kernel_signature(lambda q, k, v, attn_mask=None: q)
    ad = kernel_adapter(nn.dot_product_attention, "cpu", "flax:kernel:flax.linen:dot_product_attention")
    assert ad.trusted is False and ad.name.startswith("flax:kernel:")
    for name in ("mask+bias+causal_tl", "lengths+causal_br", "scale"):
        q, k, v = qkv()
        case = Case.build(q, k, v, dtype="float32", **CASES[name])
        assert conforms_off_empty_rows(ad.run(case).out, case), name


# ---- flax:linen-dpa-fp32-softmax and the float16 overflow region --------------------------------
def test_fp32_softmax_variant_documented_behaviours():
    from attnconf.adapters.flax import LinenDpaFp32SoftmaxAdapter
    from attnconf.adapters.flax import witnesses as witnesses_flax  # noqa: F401  (registers the witnesses)

    ad = LinenDpaFp32SoftmaxAdapter("cpu", {})
    case = WITNESSES["plain_bfloat16"]()
    res = ad.run(case)
    assert res.out_dtype == "float32" and judge_output(res.out, case).ok     # FLAX-FP32SOFTMAX-HALF-OUTPUT-F32
    case = WITNESSES["fully_masked_row_float64"]()
    out = ad.run(case).out
    assert np.isnan(out[0, 0, 1]).all() and np.isfinite(out[0, 0, [0, 2, 3]]).all()   # FLAX-FP32SOFTMAX-EMPTY-NAN-F64
    case = WITNESSES["float64_precision"]()
    assert not judge_output(ad.run(case).out, case).ok                        # FLAX-FP32SOFTMAX-FLOAT64-F32
    q, k, v = qkv()
    case = Case.build(q, k, v, dtype="float32", causal="top_left")
    assert (ad.run(case).out == LinenDpaAdapter("cpu", {}).run(case).out).all()   # float32: the default path


def test_float16_overflow_region_and_witness(dpa):
    from attnconf.adapters.flax import regions as regions_flax, witnesses as witnesses_flax  # noqa: F401

    case = WITNESSES["float16_hidden_logit_overflow"]()
    rows = regions_flax.float16_logit_overflow_rows(case)
    assert rows.shape == (1, 1, 3) and rows.all() and bool(rows)
    assert np.isnan(dpa.run(case).out).all()                                  # FLAX-LINEN-F16-LOGIT-OVERFLOW
    masked = case.replace(bias=None, mask=np.arange(5) != 0)                  # the same key hidden by the mask
    assert not bool(regions_flax.float16_logit_overflow_rows(masked))
    assert conforms_off_empty_rows(dpa.run(masked).out, masked)
    assert not bool(regions_flax.float16_logit_overflow_rows(case.replace(dtype="bfloat16")))
