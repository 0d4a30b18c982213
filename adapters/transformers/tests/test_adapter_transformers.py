"""Quick checks of the transformers backend on CPU: how a Case maps onto transformers' calls (windows to the
exact boundary key), agreement with the reference, honest refusals, and that every divergence's witness
behaves as its entry says. Flex compiles per graph (tens of seconds on CPU): its checks are marked slow."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnconf.adapters.transformers import adapter as tfa  # noqa: E402
from attnconf.adapters.transformers import alternatives as A  # noqa: E402
from attnconf.adapters.transformers import regions as RT  # noqa: E402
from attnconf.conformance.engine import tolerance as T  # noqa: E402
from attnconf.adapters.transformers import witnesses as witnesses_transformers  # noqa: E402,F401 (registers the witnesses)
from attnconf.conformance.engine.witnesses import WITNESSES  # noqa: E402
from attnconf.conformance.engine.witnesses import load_all as load_witnesses  # noqa: E402
from attnconf.reference import Case, oracle, visibility  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
ENTRIES = tomllib.loads((ROOT / "adapters" / "transformers" / "divergences.toml").read_text())["divergence"]
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}

EAGER, SOFTCAP, SINKS, SDPA = (tfa.EagerAdapter(), tfa.EagerSoftcapAdapter(), tfa.EagerSinksAdapter(),
                               tfa.SdpaAdapter())
FAST = {a.name: a for a in (EAGER, SOFTCAP, SINKS, SDPA)}


def _case(seed=0, B=2, H=2, Hkv=None, Lq=5, Lk=7, D=8, Dv=None, **kw) -> Case:
    rng = np.random.default_rng(seed)
    Hkv = Hkv or H
    return Case.build(rng.normal(size=(B, H, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)),
                      rng.normal(size=(B, Hkv, Lk, Dv or D)), grad_out=rng.normal(size=(B, H, Lq, Dv or D)), **kw)


def _with_sinks(name: str, case: Case) -> Case:
    return case.replace(sinks=np.linspace(-1.0, 0.5, case.shape["Hq"])) if name.endswith("sinks") else case


# ---- how windows map: the boundary keys, exactly ------------------------------------------------------

WINDOWS = [
    # (window, align, causal, Lq, Lk, expected plan)
    ((2, 0), "top_left", None, 6, 6, "sliding_window=3"),
    ((2, 0), "bottom_right", "bottom_right", 6, 6, "sliding_window=3"),
    ((0, 0), "bottom_right", None, 4, 4, "sliding_window=1"),
    ((3, 0), "bottom_right", None, 3, 9, "sliding_window=4"),        # a DynamicCache holding 6 keys
    ((3, 5), "bottom_right", "bottom_right", 3, 9, "sliding_window=4"),  # causal cuts the right bound to 0
    ((-1, 0), "bottom_right", None, 3, 9, "create_causal_mask"),      # unbounded left: plain causal
    ((2, 2), "top_left", None, 7, 7, "bidirectional_sliding_window_mask(sliding_window=2)"),
    ((0, 0), "top_left", None, 5, 5, "sliding_window=1"),
]


def _onehot(window, align, causal, lq, lk, dtype="float32", kv_lengths=None) -> Case:
    """V = identity (Dv = Lk), small logits: the output row is the weight row, positive exactly where visible."""
    rng = np.random.default_rng(1)
    q, k = 0.3 * rng.normal(size=(2, 2, lq, 8)), 0.3 * rng.normal(size=(2, 1, lk, 8))
    v = np.broadcast_to(np.eye(lk), (2, 1, lk, lk)).copy()
    return Case.build(q, k, v, window=window, window_align=align, causal=causal, dtype=dtype, kv_lengths=kv_lengths)


def _assert_boundaries(res, case: Case) -> None:
    vis = oracle(case).visible
    got = res.out > 0
    assert np.array_equal(got, vis), f"visible keys differ at {np.argwhere(got != vis)[:5].tolist()}"
    assert (res.out[~vis] == 0).all()
    assert T.judge_output(res.out, case).ok


@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.parametrize("window,align,causal,lq,lk,expected", WINDOWS)
def test_window_boundaries_exact(name, window, align, causal, lq, lk, expected):
    """Every key inside the inclusive window has weight > 0, the first key outside has weight exactly 0."""
    a = FAST[name]
    case = _with_sinks(name, _onehot(window, align, causal, lq, lk))
    assert a.supports(case) is True
    p = tfa.plan(case, bias_in_model_mode=a.bias_in_model_mode)
    assert expected in p.describe()
    res = a.run(case)
    assert expected in res.kernel
    _assert_boundaries(res, case)


def test_sliding_window_cache_keeps_w_minus_1_keys():
    """With a cache of P = 6 keys and sliding_window = 4, the layer's DynamicSlidingWindowLayer keeps the last
    3 and the kernel sees 3 + Lq keys, exactly the ones the window can reach; the result is unchanged."""
    case = _onehot((3, 0), "bottom_right", None, 3, 9)
    cfg = EAGER.config(case, tfa.plan(case, bias_in_model_mode=False))
    p = tfa.plan(case, bias_in_model_mode=False)
    k = torch.zeros(2, 1, 9, 8)
    _, keys, _ = EAGER.mask(case, p, cfg, k, k, torch.float32)
    assert keys.shape[2] == 3 + 3
    assert p.past == 6 and p.sliding_window == 4


@pytest.mark.parametrize("lq,lk,window", [(3, 9, (3, 0)), (1, 9, (3, 0)), (4, 10, (2, 0)), (5, 5, (2, 0))])
def test_window_with_cache_and_padding_mask(lq, lk, window):
    """A sliding layer's cache drops keys (kv_offset > 0) while the 2D padding mask covers every position:
    the mask is read at absolute key positions. sdpa (boolean masks, so padded-empty rows stay 0)."""
    rng = np.random.default_rng(3 + lq)
    q, k = 0.3 * rng.normal(size=(2, 2, lq, 8)), 0.3 * rng.normal(size=(2, 1, lk, 8))
    v = np.broadcast_to(np.eye(lk), (2, 1, lk, lk)).copy()
    case = Case.build(q, k, v, window=window, window_align="bottom_right", mask=rng.random((2, 1, 1, lk)) > 0.3,
                      dtype="float32")
    res = SDPA.run(case)
    assert "2D attention_mask" in res.kernel and (lq == lk or "DynamicCache" in res.kernel)
    _assert_boundaries(res, case)


@pytest.mark.parametrize("window,align,lq,lk,why", [
    ((2, 0), "top_left", 3, 8, "bottom-right"),               # a cache aligns windows bottom-right only
    ((2, 1), "top_left", 5, 5, "neither causal"),
    ((2, -1), "top_left", 5, 5, "neither causal"),
    ((2, 2), "top_left", 4, 6, "self-attention only"),
    ((2, 0), "bottom_right", 6, 4, "Lq <= Lk"),
])
def test_unexpressible_windows_are_refused(window, align, lq, lk, why):
    case = _onehot(window, align, None, lq, lk)
    for a in FAST.values():
        reason = a.supports(_with_sinks(a.name, case))
        assert isinstance(reason, str) and why in reason, reason


def test_window_with_per_batch_lengths():
    """Top-left window with padding maps (offset 0 either way); bottom-right with kv_len < Lk does not.
    (sdpa: the padding empties row 4 of batch 1, which the eager functions fill with the mean of V.)"""
    ok = _onehot((1, 0), "top_left", None, 5, 5, kv_lengths=[5, 3])
    res = SDPA.run(ok)
    _assert_boundaries(res, ok)
    bad = _onehot((1, 0), "bottom_right", None, 5, 5, kv_lengths=[5, 3])
    assert "kv_len" in EAGER.supports(bad)


# ---- agreement with the reference, honest scope ------------------------------------------------------

CASES = {
    "plain_cross": dict(),
    "self": dict(Lq=7),
    "causal_self": dict(Lq=7, causal="top_left"),
    "causal_cache": dict(causal="bottom_right"),
    "causal_top_left_cross": dict(causal="top_left"),                      # custom 4D mask
    "key_mask": dict(mask=np.random.default_rng(5).random((2, 1, 1, 7)) > 0.3),
    "key_mask_causal_cache": dict(mask=np.random.default_rng(5).random((2, 1, 1, 7)) > 0.3, causal="bottom_right"),
    "query_mask": dict(mask=np.random.default_rng(5).random((2, 1, 5, 7)) > 0.3),
    "head_mask": dict(mask=np.random.default_rng(5).random((2, 2, 5, 7)) > 0.2),
    "bias": dict(bias=np.random.default_rng(6).normal(size=(1, 2, 5, 7))),
    "bias_causal": dict(bias=np.random.default_rng(6).normal(size=(5, 7)), causal="bottom_right"),
    "kv_lengths": dict(kv_lengths=[7, 3]),
    "gqa": dict(H=4, Hkv=2),
    "mqa_decode": dict(H=4, Hkv=1, Lq=1, causal="bottom_right"),
    # one query, GQA and a padding mask: sdpa's pack_gqa path (query and mask reshaped per KV head)
    "gqa_decode_padding": dict(H=4, Hkv=2, Lq=1, causal="bottom_right", mask=np.array([0, 1, 1, 1, 1, 0, 1], bool)),
    "gqa_decode_bias": dict(H=4, Hkv=2, Lq=1, causal="bottom_right",
                            bias=np.random.default_rng(7).normal(size=(2, 4, 1, 7))),
    "dv_ne_dk": dict(Dv=5),
    "scale": dict(scale=-0.7),
    "softcap": dict(softcap=1.5),
    "window": dict(window=(2, 0), window_align="bottom_right"),
    "noncontiguous": dict(layout="noncontiguous", causal="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_impl_matches_reference(name, dtype, kind):
    a = FAST[name]
    case = _with_sinks(name, _case(dtype=dtype, **CASES[kind]))
    ok = a.supports(case)
    if kind == "softcap" and name in ("transformers:eager", "transformers:eager-sinks", "transformers:sdpa"):
        assert ok == f"{name} lacks softcap"
        return
    assert ok is True, ok
    res = a.run(case)
    assert res.out_dtype == dtype
    j = T.judge_output(res.out, case)
    assert j.ok, j.explain()
    if res.weights is not None:
        w = oracle(case).weights
        assert np.abs(res.weights - w).max() <= 4 * EPS[dtype] * (1 + case.shape["Lk"])


@pytest.mark.parametrize("name", ["transformers:eager", "transformers:sdpa"])
def test_gradients_match_reference(name):
    case = _case(dtype="float32", bias=np.random.default_rng(1).normal(size=(5, 7)), causal="bottom_right")
    res = FAST[name].run(case, grads=True)
    assert set(res.grads) == {"dq", "dk", "dv", "dbias"} and res.grads["dbias"].shape == (5, 7)
    assert all(j.ok for j in T.judge_gradients(res.grads, case))


def test_dropout_runs_in_training_mode():
    case = _case(dtype="float32", dropout_p=0.5, seed=3)
    out = EAGER.run(case).out
    assert not np.allclose(out, oracle(case).out)   # dropout applied: module.training was set
    assert np.array_equal(out, EAGER.run(case).out)  # seeded by case.seed


@pytest.mark.parametrize("case_kw,name,why", [
    (dict(q_lengths=[5, 2]), "transformers:eager", "lacks q_lengths"),
    (dict(alibi_slopes=np.ones(2)), "transformers:sdpa", "lacks alibi"),
    (dict(softcap=2.0), "transformers:sdpa", "lacks softcap"),
    (dict(sinks=np.zeros(2)), "transformers:eager", "lacks sinks"),
    (dict(dtype="float64"), "transformers:flex", "does not run float64"),
    (dict(dropout_p=0.1), "transformers:flex", "lacks dropout"),
    (dict(), "transformers:eager-sinks", "no sinks"),
    (dict(window=(2, 0), bias=np.zeros((5, 7))), "transformers:eager", "custom 4D mask"),
    (dict(window=(2, 0), mask=np.random.default_rng(0).random((5, 7)) > 0.5), "transformers:sdpa", "varies over"),
    (dict(causal="bottom_right", Lq=7, Lk=5, window=(1, 0)), "transformers:eager", "Lq <= Lk"),
])
def test_refusals_name_a_reason(case_kw, name, why):
    a = FAST.get(name) or tfa.FlexAdapter()
    reason = a.supports(_case(**case_kw))
    assert isinstance(reason, str) and why in reason, reason


def test_flex_declares_cpu_limits():
    flex = tfa.FlexAdapter()
    assert "grads" not in flex.capabilities and "dropout" not in flex.capabilities
    assert flex.dtypes == ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("shapes", [((2, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8)), ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)),
                                    ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8))])
def test_eager_raises_on_invalid_shapes(shapes):
    rng = np.random.default_rng(0)
    with pytest.raises(Exception):
        EAGER.run_raw(*(rng.normal(size=s) for s in shapes), "float32")


# ---- divergences: each witness shows what its entry says ----------------------------------------------

def _out_bound(case: Case, expected: np.ndarray) -> np.ndarray:
    """A first-order rounding bound for an output that is a convex combination of V computed in the case's
    dtype: each of Lk weights and products and the final rounding cost eps_t relative, at the size of V."""
    vmax = np.abs(case.v).max()
    return (case.shape["Lk"] + 4) * EPS[case.dtype] * max(vmax, np.abs(expected).max())


def _expected(entry, case: Case) -> dict[str, np.ndarray] | None:
    instead = entry["instead"]
    if instead == "mean_of_values":
        return A.mean_of_mask_hidden_values(case)
    if instead in A.ALTERNATIVES:
        return A.ALTERNATIVES[instead](case)
    return None


def _region_rows(entry, case: Case) -> np.ndarray:
    name = entry["region"]
    if hasattr(RT, name):
        return getattr(RT, name)(case)
    empty = A.empty_rows(case)
    hidden = A.mask_hidden_keys(case).any(axis=-1)
    rows = {"fully_masked_rows": empty, "mask_emptied_rows": empty & hidden, "bias_emptied_rows": empty & ~hidden}
    if name in rows:
        return rows[name]
    from attnconf.conformance.engine.regions import rows_of

    got = rows_of(name, case)                       # the engine's regions (nonpositive_scale_is_causal, ...)
    return np.ones(case.out_shape[:3], dtype=bool) if got is None else got  # None: a case region that matches


# alternatives that judge a result themselves (adapters/transformers/alternatives.py, torch's shared
# recomputed_weights_float32): checked on the witness through the suite's own masks and tolerance model
CHECKED = ("eager_min_mask", "finfo_min_mask_through_logits", "sliding_window_one_decode", "float32_softmax_weights",
           "recomputed_weights_float32")


def _check_declared(entry, case: Case, a) -> None:
    from attnconf.conformance.engine import alternatives
    from attnconf.conformance.engine.divergences import covered_elements
    from attnconf.conformance.engine.regions import load_all, rows_of

    load_all()
    alternatives.load_all()
    grads = any(q in entry.get("quantities", []) for q in ("dq", "dk", "dv", "dbias"))
    res = a.run(case, grads=grads)
    rows = rows_of(entry["region"], case)
    masks = {}
    for q in entry.get("quantities", ["out"]):
        arr = res.weights if q == "weights" else getattr(res, q, None) if q in ("out", "lse") else \
            (res.grads or {}).get(q)
        if arr is not None:
            masks[q] = covered_elements(case, rows, q, np.shape(arr))
    assert masks and any(m.any() for m in masks.values()), f"{entry['id']}: the witness is outside the region"
    v = alternatives.ALTERNATIVES[entry["instead"]].check(entry, case, res, masks)
    assert v.ok, (entry["id"], a.name, v.detail)
    if entry["instead"] != "recomputed_weights_float32":   # the flash backward may be accurate on a given case
        assert not alternatives.conforms(case, res, masks) or "weights" in masks, \
            f"{entry['id']}: {a.name} conforms on its witness"


FLEX_ONLY = [e for e in ENTRIES if e["implementations"] == ["transformers:flex"]]


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e not in FLEX_ONLY],
                         ids=[e["id"] for e in ENTRIES if e not in FLEX_ONLY])
def test_witness_shows_the_divergence(entry):
    load_witnesses()      # an entry may name another pack's witness (torch's flash_grad_large_logits)
    case = WITNESSES[entry["witness"]]()
    impls = [FAST[n] for n in entry["implementations"] if n in FAST]
    assert impls, entry["id"]
    for a in impls:
        if entry["instead"] == "returns":
            out = a.run_raw(case.q, case.k, case.v, "float32")
            assert out.shape == (1, 2, 4, 8)
            continue
        if entry["instead"] == "raises":
            with pytest.raises(Exception):
                a.run(case)
            continue
        if entry["instead"] in CHECKED:
            _check_declared(entry, case, a)
            continue
        if entry["instead"] == "nan_or_spec" and case.grad_out is None:
            case = case.replace(grad_out=np.random.default_rng(0).normal(size=case.out_shape))
        if entry["instead"] == "nan_or_spec" and entry["region"].startswith("nonpositive_scale"):
            res = a.run(case, grads=True)              # the scale's sign decides which gradients are NaN
            assert any(np.isnan(g).any() for g in res.grads.values()), entry["id"]
            continue
        if entry["instead"] == "nan_or_spec":          # NaN rows back-propagated: dQ of the row, dK/dV of its head
            res = a.run(case, grads=True)
            rows = _region_rows(entry, case)
            assert rows.any(), f"{entry['id']}: the witness is outside the region"
            assert np.isnan(res.grads["dq"][np.broadcast_to(rows[..., None], res.grads["dq"].shape)]).all()
            assert np.isnan(res.grads["dk"]).all() and np.isnan(res.grads["dv"]).all(), entry["id"]
            continue
        grads = any(q in entry.get("quantities", ["dq"]) for q in ("dq", "dk", "dv")) and entry["instead"] != "nan"
        res = a.run(case, grads=grads)
        rows = _region_rows(entry, case)
        assert rows.any(), f"{entry['id']}: the witness is outside the region"
        if not grads:
            assert not T.judge_output(res.out, case).ok, f"{entry['id']}: {a.name} conforms on its witness"
        inside = np.broadcast_to(rows[..., None], res.out.shape)
        ref = oracle(case).out
        with np.errstate(invalid="ignore"):
            outside_ok = T.judge_output(np.where(inside, ref, res.out), case).ok
        if entry["instead"] == "float32_precision":
            err = np.abs(res.out - ref).max()
            assert 1e-12 < err < 64 * EPS["float32"], err
            continue
        if entry["instead"] == "nan":
            assert np.isnan(res.out[inside]).all()
            continue
        if entry["instead"] == "non_finite":
            assert (~np.isfinite(res.out[inside])).any() and outside_ok
            continue
        assert outside_ok, f"{entry['id']}: {a.name} fails outside the region too"
        expected = _expected(entry, case)
        if grads:
            for n, g in expected.items():
                mag = np.abs(g).max() + np.abs(res.grads[n]).max()
                tol = 4 * (case.shape["Lk"] + case.shape["Dk"] + 4) * EPS[case.dtype] * mag
                assert np.abs(res.grads[n] - g).max() <= tol, (entry["id"], n, np.abs(res.grads[n] - g).max(), tol)
            ref_g = __import__("attnconf.reference", fromlist=["backward"]).backward(case)
            assert np.abs(res.grads["dq"] - ref_g.dq).max() > 1e-3, "the spec's dQ (0 on the covered rows) holds"
            continue
        got, exp = res.out[inside], expected["out"][inside]
        assert np.abs(got - exp).max() <= _out_bound(case, exp), (entry["id"], np.abs(got - exp).max())


def test_sinks_and_sdpa_conform_on_left_padding():
    """gpt-oss's sink takes the empty rows' weight (0 out), and sdpa without a bias keeps the mask boolean."""
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        case = WITNESSES["hf_left_padded_f32"]().replace(dtype=dtype)
        assert T.judge_output(SDPA.run(case).out, case).ok
        sc = case.replace(sinks=np.array([0.5, -1.0]))
        assert T.judge_output(SINKS.run(sc).out, sc).ok


def test_float16_buckets_differ_from_the_mean():
    """The float16 eager witness is a case where the bucket rule and the mean of V disagree."""
    case = WITNESSES["hf_left_padded_f16_large_logits"]()
    rows = A.empty_rows(case)
    res = EAGER.run(case)
    assert np.abs(res.out - A.mean_of_mask_hidden_values(case)["out"])[rows].max() > 0.1
    assert np.array_equal(res.out[rows], A.eager_float16_min_mask(case)["out"][rows])


def test_regions_are_row_arrays():
    case = WITNESSES["hf_left_padded_bias_f32"]()
    rows = RT.finfo_min_mask_rows_with_bias(case)
    assert rows.shape == (2, 2, 6) and rows[0, :, :2].all() and rows.sum() == 4
    assert not RT.finfo_min_mask_rows_with_bias(WITNESSES["hf_left_padded_f32"]()).any()


# ---- flex (compiles per graph: slow) -----------------------------------------------------------------

def _flex_run(case: Case):
    """Run flex; a recompile that hits torch inductor's CPU template bug (adapters/transformers/findings/
    TRANSFORMERS-FLEX-CPU-COMPILE-ERROR.md: undeclared `cur_kvSplitSize<digits>` / `cur_qSplitSize<digits>`,
    depending on the calls before it in the process) skips with that name; any other error fails."""
    try:
        return tfa.FlexAdapter().run(case)
    except Exception as exc:
        text = str(exc.__cause__ or exc)
        if "CppCompileError" in text and re.search(r"cur_(q|kv)SplitSize\d", text):
            pytest.skip("TRANSFORMERS-FLEX-CPU-COMPILE-ERROR (torch inductor CPU flex template) in this sequence")
        raise


@pytest.mark.slow
@pytest.mark.parametrize("window,align,causal,lq,lk,expected", WINDOWS[:4] + WINDOWS[6:7])
def test_flex_window_boundaries_exact(window, align, causal, lq, lk, expected):
    case = _onehot(window, align, causal, lq, lk)
    assert tfa.FlexAdapter().supports(case) is True
    _assert_boundaries(_flex_run(case), case)


@pytest.mark.slow
@pytest.mark.parametrize("entry", FLEX_ONLY, ids=[e["id"] for e in FLEX_ONLY])
def test_flex_witness_raises(entry):
    """The flex-only entries are all `raises`: the witness raises, naming the BlockMask/key-length mismatch."""
    assert entry["instead"] == "raises"
    case = WITNESSES[entry["witness"]]()
    assert getattr(RT, entry["region"])(case)
    with pytest.raises(Exception, match="block_mask was created for"):
        tfa.FlexAdapter().run(case)


@pytest.mark.slow
def test_flex_conforms_on_left_padding_and_softcap():
    for dtype in ("float32", "float16", "bfloat16"):
        case = WITNESSES["hf_left_padded_f32"]().replace(dtype=dtype, softcap=2.0)
        assert T.judge_output(_flex_run(case).out, case).ok
    assert "float64" in flex.supports(WITNESSES["hf_left_padded_f64"]())


@pytest.mark.parametrize("cls", [tfa.EagerAdapter, tfa.EagerSoftcapAdapter, tfa.EagerSinksAdapter])
def test_float64_dropout_cells_are_refused_before_drawing(cls):
    """The eager paths refuse every float64 dropout case (impl_support); the cells of properties that need
    dropout say so at once (Adapter.cell_refusal) instead of after Hypothesis's hundreds of refused draws."""
    from attnconf.conformance.engine.harness import refused_at_once

    adapter = cls("cpu")
    case = _case(dtype="float64").replace(dropout_p=0.25)
    reason = refused_at_once(adapter, ("dropout",), "float64")
    assert reason and reason == adapter.supports(case, need=frozenset({"dropout"}))
    assert refused_at_once(adapter, ("dropout",), "float32") is None
    assert refused_at_once(adapter, ("mask|bias",), "float64") is None
