"""The ONNX adapters: each Case maps onto its operator faithfully, declared scope is honest, and every
divergence in adapters/onnx/divergences.toml still shows on its witness.

Imports onnx (and onnxruntime where installed), never torch, JAX or TensorFlow.
"""
from __future__ import annotations

from fnmatch import fnmatch

import numpy as np
import pytest

pytest.importorskip("onnx")

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine.divergences import backend_entries  # noqa: E402
from attnconf.adapters import KernelError  # noqa: E402
from attnconf.adapters.base import NotSupported  # noqa: E402
from attnconf.adapters.onnx.graphs import attention_call, gqa_call, mha_call  # noqa: E402
from attnconf.adapters.onnx import ReferenceEvaluatorAdapter  # noqa: E402
from attnconf.adapters.onnx import alternatives as alternatives_onnx, regions as regions_onnx, witnesses as witnesses_onnx
from attnconf.conformance.engine import alternatives  # noqa: E402,F401
from attnconf.conformance.engine.divergences import Applied, Divergences  # noqa: E402
from attnconf.conformance.engine.regions import REGIONS, rows_of, touches  # noqa: E402
from attnconf.conformance.engine.regions import load_all as load_regions  # noqa: E402
from attnconf.conformance.engine.tolerance import judge_output, rounding_noise  # noqa: E402
from attnconf.conformance.engine.witnesses import WITNESSES  # noqa: E402
from attnconf.conformance.engine.witnesses import load_all as load_witnesses  # noqa: E402
from attnconf.reference import Case, expand_kv, oracle, round_to  # noqa: E402

try:
    import onnxruntime  # noqa: F401

    HAVE_ORT = True
except ImportError:
    HAVE_ORT = False
needs_ort = pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed")
RNG = np.random.default_rng(2026)


@pytest.fixture(scope="module")
def impls() -> dict:
    return {a.name: a for a in adapters.load("onnx")}


def make(B=2, Hq=4, Hkv=2, Lq=5, Lk=7, Dk=8, Dv=8, dtype="float32", **params) -> Case:
    q = RNG.normal(size=(B, Hq, Lq, Dk))
    k = RNG.normal(size=(B, Hkv, Lk, Dk))
    v = RNG.normal(size=(B, Hkv, Lk, Dv))
    return Case.build(q, k, v, dtype=dtype, **params)


def keep_rows(lq: int, lk: int, b: int = 2) -> np.ndarray:
    """A random (b, 1, lq, lk) mask that leaves every row at least one key."""
    m = RNG.random((b, 1, lq, lk)) < 0.6
    m[..., np.arange(lq), np.arange(lq) % lk] = True
    return m


def naive32_error(case: Case) -> np.ndarray:
    """|O_naive - O_ref| of a float32 naive implementation that also applies softcap and sinks: the
    yardstick for features reference/emulate.py does not model yet (same model: logits, softmax and
    P V in float32, each stage rounded to float32)."""
    f = oracle(case)
    s = case.shape
    q, k, v = (x.astype(np.float32) for x in (case.q, case.k, expand_kv(case.v, s["Hq"])))
    lg = np.float32(case.effective_scale) * np.einsum("bhid,bhjd->bhij", q, expand_kv(case.k, s["Hq"]).astype(np.float32))
    if case.softcap is not None:
        c = np.float32(case.softcap)
        lg = c * np.tanh(lg / c)
    if case.bias is not None:
        lg = lg + case.bias.astype(np.float32)
    lg = np.where(f.visible, lg, -np.inf).astype(np.float32)
    m = lg.max(axis=-1, keepdims=True)
    if case.sinks is not None:
        m = np.maximum(m, case.sinks.astype(np.float32)[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0).astype(np.float32)
    p = np.exp(lg - m)
    den = p.sum(axis=-1, keepdims=True, dtype=np.float32)
    if case.sinks is not None:
        den = den + np.exp(case.sinks.astype(np.float32)[None, :, None, None] - m)
    w = np.where(den > 0, p / np.where(den > 0, den, 1), 0).astype(np.float32)
    out = np.einsum("bhij,bhjd->bhid", w, v).astype(np.float64)
    del k, q
    return np.abs(out - f.out)


def assert_close_naive32(out: np.ndarray, case: Case) -> None:
    """ATTN-TOL-1 with the float32 naive yardstick above: e <= 2 * e_naive + 2 * max rounding noise."""
    ref = oracle(case).out
    e = float(np.abs(out - ref).max())
    allowed = 2 * float(naive32_error(case).max()) + 2 * float(rounding_noise(ref, "float32").max())
    assert np.isfinite(out).all() and e <= allowed, f"error {e:.3g} > allowed {allowed:.3g}"


# ---- the standard Attention operator: mapping -------------------------------------------------
ATTENTION_CASES = {
    "plain": lambda: make(),
    "mask": lambda: make(mask=keep_rows(5, 7)),
    "mask-2d": lambda: make(mask=keep_rows(5, 7)[0, 0]),
    "bias": lambda: make(bias=RNG.normal(size=(1, 4, 5, 7))),
    "bias-with-inf": lambda: make(bias=np.where(keep_rows(5, 7), RNG.normal(size=(2, 1, 5, 7)), -np.inf)),
    "causal-top-left": lambda: make(causal="top_left"),
    "causal-bottom-right (past_key)": lambda: make(causal="bottom_right"),
    "causal-bottom-right Lq>Lk (nonpad)": lambda: make(Lq=7, Lk=5, causal="bottom_right"),
    "mask+causal": lambda: make(Lq=6, Lk=6, mask=keep_rows(6, 6), causal="top_left"),
    "kv_lengths (nonpad)": lambda: make(kv_lengths=[3, 7]),
    "kv_lengths+bottom-right": lambda: make(kv_lengths=[5, 7], causal="bottom_right"),
    "kv_lengths+top-left (folded)": lambda: make(kv_lengths=[3, 7], causal="top_left"),
    "q_lengths (folded)": lambda: make(q_lengths=[2, 5]),
    "mqa": lambda: make(Hkv=1),
    "scale": lambda: make(scale=0.3),
    "dv_ne_dk": lambda: make(Dv=5),
    "window bottom-right": lambda: make(Lq=6, Lk=9, window=(2, 0), causal="bottom_right"),
    "window top-left": lambda: make(Lq=6, Lk=9, window=(1, 1), window_align="top_left"),
}


@pytest.mark.parametrize("label", sorted(ATTENTION_CASES))
@pytest.mark.parametrize("name", ["onnx:reference", pytest.param("onnx:ort-attention", marks=needs_ort)])
def test_attention_matches_reference(impls, name, label):
    case = ATTENTION_CASES[label]()
    res = impls[name].run(case)
    assert res.out_dtype == "float32"
    j = judge_output(res.out, case)
    assert j.ok, j.explain()


def test_attention_routes_and_opsets():
    """Which inputs carry which feature, and the opset each needs (23; 24 nonpad_kv_seqlen; 25 windows)."""
    plain = attention_call(make())
    assert plain.opset == 23 and "attn_mask" not in plain.feeds and plain.attrs == {}
    br = attention_call(make(Lq=3, Lk=7, causal="bottom_right"))
    assert br.attrs["is_causal"] == 1 and br.feeds["past_key"].shape[2] == 4 and br.opset == 23
    kv = attention_call(make(kv_lengths=[5, 7], causal="bottom_right"))
    assert kv.opset == 24 and kv.feeds["nonpad_kv_seqlen"].tolist() == [5, 7] and kv.attrs["is_causal"] == 1
    tl = attention_call(make(kv_lengths=[3, 7], causal="top_left"))
    assert "is_causal" not in tl.attrs and tl.feeds["attn_mask"].shape == (2, 1, 5, 7)   # folded: offset differs
    win = attention_call(make(Lq=6, Lk=9, window=(2, 0), window_align="top_left"))
    assert win.opset == 25 and (win.attrs["left_window_size"], win.attrs["right_window_size"]) == (2, 0)
    key_axis = attention_call(make(mask=np.ones((2, 1, 5, 1), dtype=bool)))
    assert key_axis.feeds["attn_mask"].shape == (2, 1, 5, 7)    # the schema pads a short key axis with -inf


def test_reference_weights_are_returned(impls):
    case = make(mask=keep_rows(5, 7), causal="top_left", Lq=5, Lk=7)
    res = impls["onnx:reference"].run(case)
    assert res.weights is not None and res.weights.shape == (2, 4, 5, 7)
    assert (res.weights[~oracle(case).visible] == 0).all()
    assert np.allclose(res.weights, oracle(case).weights, atol=1e-6)


@pytest.mark.parametrize("name", ["onnx:reference", pytest.param("onnx:ort-attention", marks=needs_ort)])
def test_softcap_against_float32_naive(impls, name):
    case = make(softcap=1.5, scale=2.0)
    assert_close_naive32(impls[name].run(case).out, case)


# ---- GroupQueryAttention and MultiHeadAttention ------------------------------------------------
GQA_CASES = {
    "causal square": lambda: make(Lq=6, Lk=6, causal="bottom_right"),
    "causal cache (query_seqlens)": lambda: make(Lq=3, Lk=9, causal="bottom_right"),
    "non-causal cache, B=1": lambda: make(B=1, Lq=3, Lk=9),
    "kv_lengths cache": lambda: make(Lq=3, Lk=9, kv_lengths=[5, 9], causal="bottom_right"),
    "mask": lambda: make(B=1, Lq=6, Lk=6, mask=keep_rows(6, 6, b=1)),
    "bias": lambda: make(Lq=6, Lk=6, bias=RNG.normal(size=(1, 4, 6, 6)), causal="bottom_right"),
    "mqa": lambda: make(Hkv=1, Lq=6, Lk=6, causal="bottom_right"),
    "scale": lambda: make(Lq=6, Lk=6, causal="bottom_right", scale=-0.4),
    "window": lambda: make(Lq=4, Lk=10, window=(2, 0), causal="bottom_right"),
    "non-causal cache, B=2 (one call per element)": lambda: make(Lq=3, Lk=9, mask=keep_rows(3, 9),
                                                                 kv_lengths=[5, 9]),
}


@needs_ort
@pytest.mark.parametrize("label", sorted(GQA_CASES))
@pytest.mark.parametrize("name", ["onnx:ort-gqa", "onnx:ort-gqa-unfused"])
def test_gqa_matches_reference(impls, name, label):
    case = GQA_CASES[label]()
    res = impls[name].run(case)
    j = judge_output(res.out, case)
    assert j.ok, j.explain()


@needs_ort
def test_gqa_sinks_and_softcap(impls):
    case = make(Lq=6, Lk=6, causal="bottom_right", sinks=RNG.normal(size=4), softcap=2.0)
    assert_close_naive32(impls["onnx:ort-gqa"].run(case).out, case)


@needs_ort
def test_gqa_local_window_counts_the_current_key(impls):
    """local_window_size = left + 1 (microsoft/onnxruntime#25927): window (2, 0) sees keys i-2 .. i."""
    L = 8
    case = Case.build(RNG.normal(size=(1, 1, L, 8)), RNG.normal(size=(1, 1, L, 8)), np.eye(L)[None, None],
                      window=(2, 0), causal="bottom_right", dtype="float32")
    assert gqa_call(case).attrs["local_window_size"] == 3
    assert impls["onnx:ort-gqa"].scope()["head_dims"][0] == 8
    w = impls["onnx:ort-gqa"].run(case).out[0, 0]
    assert ((w > 0) == oracle(case).visible[0, 0]).all()


MHA_CASES = {
    "plain": lambda: make(Hkv=4),
    "mask": lambda: make(Hkv=4, mask=keep_rows(5, 7)),
    "bias": lambda: make(Hkv=4, bias=RNG.normal(size=(2, 1, 5, 7))),
    "kv_lengths": lambda: make(Hkv=4, kv_lengths=[3, 7]),
    "causal square": lambda: make(Hkv=4, Lq=6, Lk=6, causal="top_left"),
    "causal Lq>Lk": lambda: make(Hkv=4, Lq=7, Lk=5, causal="top_left"),
    "bottom-right (folded)": lambda: make(Hkv=4, causal="bottom_right"),
    "scale": lambda: make(Hkv=4, scale=-0.3),
    "dv_ne_dk": lambda: make(Hkv=4, Dv=5),
}


@needs_ort
@pytest.mark.parametrize("label", sorted(MHA_CASES))
def test_mha_matches_reference(impls, label):
    case = MHA_CASES[label]()
    j = judge_output(impls["onnx:ort-mha"].run(case).out, case)
    assert j.ok, j.explain()


def test_mha_padding_is_exact():
    """key_padding_mask with mask_filter_value = -inf (the default -10000 is not masking)."""
    call = mha_call(make(Hkv=4, kv_lengths=[3, 7]))
    assert call.attrs["mask_filter_value"] == float("-inf")
    assert call.feeds["key_padding_mask"].tolist() == [3, 7]


# ---- declared scope is honest ---------------------------------------------------------------------
REFUSALS = [  # (implementation, case, a fragment of the reason)
    ("onnx:ort-attention", lambda: make(dtype="bfloat16"), "does not run bfloat16"),
    ("onnx:ort-attention", lambda: make(sinks=np.zeros(4)), "lacks sinks"),
    ("onnx:ort-gqa", lambda: make(Dk=4, Dv=4, Lq=5, Lk=5), "multiple of 8"),
    ("onnx:ort-gqa", lambda: make(Dv=16), "lacks dv_ne_dk"),
    ("onnx:ort-gqa", lambda: make(Lq=7, Lk=5, causal="bottom_right"), "kv_len >= Lq"),
    ("onnx:ort-gqa", lambda: make(Lq=3, Lk=7, causal="top_left"), "lacks causal_top_left"),
    ("onnx:ort-gqa", lambda: make(q_lengths=[2, 5]), "lacks q_lengths"),
    ("onnx:ort-mha", lambda: make(), "lacks gqa"),
    ("onnx:ort-mha", lambda: make(Hkv=4, dtype="bfloat16"), "does not run bfloat16"),
    ("onnx:reference", lambda: make(grad_out=np.zeros((2, 4, 5, 8))), None),
]


@needs_ort
@pytest.mark.parametrize("i", range(len(REFUSALS)))
def test_refused_with_a_reason(impls, i):
    name, build, fragment = REFUSALS[i]
    impl, case = impls[name], build()
    if fragment is None:   # gradients: an inference runtime has none
        assert impl.supports(case, need=frozenset({"grads"})) != True  # noqa: E712
        with pytest.raises(NotSupported):
            impl.run(case, grads=True)
        return
    reason = impl.supports(case)
    assert reason is not True and fragment in reason, reason


@needs_ort
@pytest.mark.parametrize("name,dtype", [("onnx:ort-attention", "bfloat16"), ("onnx:ort-gqa", "float64"),
                                        ("onnx:ort-gqa", "bfloat16"), ("onnx:ort-mha", "bfloat16")])
def test_undeclared_dtypes_really_do_not_run(impls, name, dtype):
    """A dtype left out of the declaration is one the runtime has no kernel for (not a cautious guess)."""
    impl = impls[name]
    case = make(Hkv=4 if name.endswith("mha") else 2, Lq=6, Lk=6, dtype=dtype,
                causal="bottom_right" if "gqa" in name else None)
    with pytest.raises(KernelError, match="could not build|NOT_IMPLEMENTED|implementation"):
        impl._run_call(impl.call_for(case))


@needs_ort
def test_float64_attention_is_the_function_body(impls):
    """No float64 kernel: onnxruntime inlines the function body, whose scale is float32 (a declared divergence)."""
    case = make(dtype="float64")
    res = impls["onnx:ort-attention"].run(case)
    assert res.out_dtype == "float64" and "function body" in res.kernel
    assert not judge_output(res.out, case).ok
    expected = oracle(alternatives_onnx.function_body_scale_case(case)).out
    assert np.abs(res.out - expected).max() < 1e-14


@needs_ort
@pytest.mark.parametrize("name", ["onnx:ort-attention", "onnx:ort-gqa", "onnx:ort-mha", "onnx:reference"])
def test_invalid_shapes_raise(impls, name):
    """ATTN-OP-6: K and V of different lengths must raise."""
    q, k, v = RNG.normal(size=(1, 2, 4, 8)), RNG.normal(size=(1, 2, 5, 8)), RNG.normal(size=(1, 2, 6, 8))
    with pytest.raises(Exception):
        impls[name].run_raw(q, k, v, "float32")


@needs_ort
def test_graphs_are_cached_per_signature(impls):
    impl = type(impls["onnx:ort-attention"])()
    impl.run(make(Lq=3, Lk=4))
    impl.run(make(Lq=9, Lk=17, B=1))           # another shape, same signature
    assert impl.cache.built == 1 and impl.cache.hits == 1
    impl.run(make(scale=0.3))                  # an attribute value is part of the signature
    assert impl.cache.built == 2
    d = impl.describe()
    assert d["graphs_built"] == 2 and d["cache_hits"] == 1 and d["onnxruntime"]


# ---- divergences: every entry's witness still shows its behaviour ----------------------------------
load_regions()
load_witnesses()
ENTRIES = backend_entries("onnx")


def _behaves_as_declared(impl, entry) -> tuple[bool, str]:
    """The witness departs from the spec, and its covered elements match the entry's alternative."""
    case = WITNESSES[entry["witness"]]()
    rows = rows_of(entry["region"], case)
    if not touches(rows):
        return False, "witness is outside the entry's region"
    try:
        res = impl.run(case)
    except (KernelError, NotSupported) as exc:
        return entry["instead"] == "raises", f"raises: {exc}"
    except Exception as exc:  # noqa: BLE001 (the reference evaluator raises NumPy errors)
        return entry["instead"] == "raises", f"raises {type(exc).__name__}: {exc}"
    if entry["instead"] == "raises":
        return False, "returned instead of raising"
    if judge_output(res.out, case).ok:
        return False, "witness conforms (stale entry)"
    entry = Divergences([entry], "cpu").entries[0]           # defaults (quantities) filled in
    masks = Applied(entry, rows).masks(case, res)
    verdict = alternatives.ALTERNATIVES[entry["instead"]].check(entry, case, res, masks)
    return verdict.ok, verdict.detail


@needs_ort
@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_witness_shows_the_declared_behaviour(impls, entry):
    assert entry["region"] in REGIONS and entry["witness"] in WITNESSES and entry["instead"] in alternatives.ALTERNATIVES
    matched = [n for n in sorted(impls) if any(fnmatch(n, p) for p in entry["implementations"])]
    assert matched, f"{entry['id']} names no implementation of the onnx backend"
    for name in matched:
        ok, why = _behaves_as_declared(impls[name], entry)
        assert ok, f"{entry['id']} on {name}: {why}"


def test_alternatives_reproduce_the_evaluator():
    """The nearby problems of the reference evaluator's entries are exact models of it (difference ~1 ulp)."""
    impl = ReferenceEvaluatorAdapter()
    c = WITNESSES["onnx_causal_with_key_mask"]()
    assert np.abs(impl.run(c).out - oracle(alternatives_onnx.first_row_frontier_case(c)).out).max() < 1e-6
    c = WITNESSES["onnx_float64_exact_scale"]()
    assert np.abs(impl.run(c).out - oracle(alternatives_onnx.effective_scale_case(c)).out).max() < 1e-14


@needs_ort
@pytest.mark.parametrize("name", ["onnx:ort-attention", "onnx:ort-gqa", "onnx:reference"])
def test_softcap_comes_before_the_bias_and_mask(impls, name):
    """The capped logits get the bias and the mask (ATTN-CAP order): a -inf bias stays -inf after capping."""
    m = np.ones((1, 1, 6, 6), dtype=bool)
    m[0, 0, 3, :2] = False
    case = Case.build(3 * RNG.normal(size=(1, 2, 6, 8)), 3 * RNG.normal(size=(1, 2, 6, 8)), RNG.normal(size=(1, 2, 6, 8)),
                      bias=np.where(m, 0.5, -np.inf), causal="bottom_right", softcap=1.5, dtype="float32")
    assert_close_naive32(impls[name].run(case).out, case)


@needs_ort
@pytest.mark.parametrize("huge", [0, 4], ids=["key-hidden-by-the-float-mask", "key-hidden-by-the-frontier"])
def test_float16_sentinel_model_tells_a_float_mask_from_the_causal_frontier(impls, huge):
    """onnxruntime's float16 Attention (core/providers/cpu/llm/attention.cc) adds a float attn_mask as it
    is, so its -inf hides key 0 however large that key's logit; the causal frontier overwrites the mask
    with the sentinel -65504, so key 4's logit of 1.2e5 survives it and takes every row. (The adapter sends
    a float mask because the case has a bias.) The model, ort_f16_sentinel_expected, predicts both on the
    rows that see a key; with the sentinel at key 0 too, it predicted that those rows output V[0]."""
    q = np.zeros((1, 1, 4, 16))
    q[..., 0] = 8.0
    k = np.random.default_rng(3).normal(size=(1, 1, 5, 16))
    k[0, 0, huge, 0] = 60000.0                         # scaled logit 8 * 60000 / 4 = 120000
    v = np.random.default_rng(4).normal(size=(1, 1, 5, 16))
    mask = np.ones((1, 1, 4, 5), bool)
    mask[..., 0] = False
    bias = np.random.default_rng(5).normal(size=(1, 1, 4, 5))
    case = Case.build(q, k, v, mask=mask, bias=bias, causal="top_left", dtype="float16")
    assert attention_call(case).feeds["attn_mask"].dtype == np.float16
    rows = oracle(case).visible.any(axis=-1)[0, 0]
    assert rows.tolist() == [False, True, True, True]
    expected = alternatives_onnx.ort_f16_sentinel_expected(case)["out"][0, 0, rows]
    got = impls["onnx:ort-attention"].run(case).out[0, 0, rows]
    assert np.abs(got - expected).max() < 5e-3, (got[:, :3], expected[:, :3])
    leak = np.broadcast_to(case.v[0, 0, huge], expected.shape)
    assert np.allclose(expected, leak, atol=5e-3) == (huge == 4)


@needs_ort
def test_float16_logit_overflow_region_is_the_nan_rows(impls):
    """onnxruntime's float16 Attention holds its scores in float16: exactly the rows whose largest visible
    scaled logit rounds to +inf there come out NaN (ort_f16_logit_overflow_rows), the others are finite.
    Dk = 192 and scale 1 with q, k ~ N(0, 45^2), as the ci case that found it (visible logits to 1e5)."""
    rng = np.random.default_rng(7)
    q, k, v = 45 * rng.normal(size=(1, 2, 9, 192)), 45 * rng.normal(size=(1, 2, 17, 192)), rng.normal(size=(1, 2, 17, 128))
    case = Case.build(q, k, v, scale=1.0, kv_lengths=np.array([15]), dtype="float16")
    rows = regions_onnx.ort_f16_logit_overflow_rows(case)
    assert not isinstance(rows, bool) and 0 < rows.sum() < rows.size
    out = impls["onnx:ort-attention"].run(case).out
    assert np.array_equal(np.isnan(out).all(axis=-1), rows) and not np.isnan(out[~rows]).any()


@needs_ort
def test_float16_padded_keys_outweigh_visible_logits_below_the_sentinel(impls):
    """Keys past nonpad_kv_seqlen hold -65504, and a visible logit of -70000 is -inf in float16: the padded
    key takes the row (measured: it outputs V[2]). The sentinel region covers the row and its model predicts it."""
    q = np.zeros((1, 1, 1, 8))
    q[0, 0, 0, :4] = [256.0, 1.0, 1.0, 1.0]
    k = np.zeros((1, 1, 3, 8))
    k[0, 0, :2, :4] = [-255.0, -2048.0, -2048.0, -624.0]     # q.k = -70000 with keys 0 and 1
    case = Case.build(q, k, np.eye(3, 8)[None, None], scale=1.0, kv_lengths=np.array([2]), dtype="float16")
    assert regions_onnx.ort_f16_masked_logit_survives_sentinel(case).tolist() == [[[True]]]
    assert regions_onnx.ort_f16_logit_overflow_rows(case) is False
    got = impls["onnx:ort-attention"].run(case).out[0, 0, 0]
    expected = alternatives_onnx.ort_f16_sentinel_expected(case)["out"][0, 0, 0]
    assert np.array_equal(got, expected) and expected[2] == 1.0


@needs_ort
@pytest.mark.parametrize("k1,k2,weights", [(4e30, 0.5, [0, 1, 0]), (1e30, 0.5, [0, 0.5, 0.5]),
                                           (-4e30, 0.5, [0, 0, 1]), (-4e30, -4e30, None)])
def test_mha_causal_sentinel_absorbs_only_logits_below_its_spacing(impls, k1, k2, weights):
    """MultiHeadAttention gives the keys behind its causal frontier lowest() + the scaled logit in float32,
    whose spacing there is 2^104 ~ 2.0e31: row 0 (key 0 masked, keys 1 and 2 causal-only) averages V over
    the keys at the highest score. A logit of 1.6e31 stays apart, 4e30 is absorbed (equal weight);
    -1.6e31 on both sends both scores to -inf and the row is NaN. ci found the first (Dk = 576, 1e30 at
    masked positions: error 1.08e30 against the equal-weight model)."""
    q = np.zeros((1, 1, 3, 8))
    q[0, 0, :, :2] = [4.0, 1.0]
    k = np.zeros((1, 1, 3, 8))
    k[0, 0, :, 1] = [0.3, 0.2, 0.1]
    k[0, 0, 1:, 0] = [k1, k2]
    mask = np.ones((1, 1, 3, 3), bool)
    mask[0, 0, 0, 0] = False
    case = Case.build(q, k, np.eye(3, 8)[None, None], mask=mask, causal="top_left", scale=1.0, dtype="float32")
    survivors = alternatives_onnx.mha_sentinel_survivors(case, regions_onnx._mha_causal_only_keys(case))[0, 0, 0]
    got = impls["onnx:ort-mha"].run(case).out[0, 0, 0, :3]
    if weights is None:
        assert not survivors.any() and np.isnan(got).all()
    else:
        assert np.array_equal(got, weights) and np.array_equal(survivors, np.array(weights) > 0)


def test_reference_evaluator_float16_overflow_rows_are_declared():
    """onnx's reference evaluator forms its logits in float16 too: on the Dk = 192, scale-1 case of
    test_float16_logit_overflow_region_is_the_nan_rows its NaN rows are exactly those of its visible-
    and hidden-overflow regions, and a row whose visible logits are all -inf comes out 0 (the witness)."""
    rng = np.random.default_rng(7)
    q, k, v = 45 * rng.normal(size=(1, 2, 9, 192)), 45 * rng.normal(size=(1, 2, 17, 192)), rng.normal(size=(1, 2, 17, 128))
    case = Case.build(q, k, v, scale=1.0, kv_lengths=np.array([15]), dtype="float16")
    impl = ReferenceEvaluatorAdapter()
    rows = regions_onnx.ref_f16_logit_overflow_rows(case) | regions_onnx.ref_f16_hidden_logit_overflow(case)
    out = impl.run(case).out
    assert rows.any() and np.array_equal(np.isnan(out).all(axis=-1), rows) and not np.isnan(out[~rows]).any()
    w = WITNESSES["onnx_f16_visible_logit_overflow"]()
    assert regions_onnx.ref_f16_logit_overflow_rows(w).tolist() == [[[True, True, False]]]
    out = impl.run(w).out[0, 0]
    assert np.isnan(out[0]).all() and (out[1] == 0).all() and np.isfinite(out[2]).all()


@needs_ort
def test_mha_last_row_takes_the_default_scale_for_scale_zero(impls):
    """MultiHeadAttention's unmasked last row (ONNX-ORT-MHA-CAUSAL-LAST-ROW) and its scale 0 read as the
    default (ONNX-ORT-CONTRIB-ZERO-SCALE-DEFAULT) compose: the row is the causal-lifted reference at scale
    1/sqrt(Dk), not at scale 0 (ci: Dk = 576, scale 0, error 3.57 against the scale-0 model)."""
    case = WITNESSES["onnx_causal_cross_more_keys"]().replace(scale=0.0)
    got = impls["onnx:ort-mha"].run(case).out[0, 0, -1]
    lifted = oracle(alternatives_onnx.causal_lifted_case(case)).out[0, 0, -1]
    assert np.abs(got - lifted).max() < 1e-6
    assert np.abs(got - oracle(case.replace(causal=None)).out[0, 0, -1]).max() > 1e-2
