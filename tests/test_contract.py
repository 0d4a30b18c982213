"""The kernel author's contract (adapters/contract.py, conformance/engine/declared.py): documented behaviour and
limits declared with the capabilities, parsed, refused with one-line errors, turned into divergence
entries and limits that `supports`, generation and `fit` honour."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnconf import adapters  # noqa: E402
from attnconf.adapters import contract as ct  # noqa: E402
from attnconf.adapters.base import NotSupported  # noqa: E402
from attnconf.conformance.engine import alternatives, declared  # noqa: E402
from attnconf.conformance.engine.scope_fit import fit  # noqa: E402
from attnconf.reference import Case  # noqa: E402

SDPA = "tests.kernels.declared"


def _case(lq=5, lk=5, dtype="float32", d=16, seed=0, **kw) -> Case:
    rng = np.random.default_rng(seed)
    return Case.build(rng.normal(size=(1, 2, lq, d)), rng.normal(size=(1, 2, lk, d)), rng.normal(size=(1, 2, lk, d)),
                      dtype=dtype, seed=seed, **kw)


def _load(kernel: str, lines: list[str] | None = None, tmp_path=None, **kw):
    caps = None
    if lines is not None:
        caps = tmp_path / "caps.toml"
        caps.write_text("\n".join(lines) + "\n")
        caps = str(caps)
    return adapters.load("torch", kernel=kernel, capabilities=caps, **kw)[0]


def test_every_key_parses(tmp_path):
    a = _load(f"{SDPA}:empty_rows_nan", [
        'empty_rows = "mean_of_values"', 'compute_dtype = "float32"', 'scale_rounding = "input_dtype"',
        "seqlen_multiple = {q = 128, k = 64}", "causal_equal_lengths = true", "grads_seqlen_multiple = 32",
        'unsupported_raises = ["ValueError", "mylib.Unsupported"]', 'representations = ["contiguous"]',
        "[[when]]", "causal = true", "seqlen_multiple = 16", "[[when]]", 'dtype = ["float16", "bfloat16"]',
        "grads = true", "grads_seqlen_multiple = 128"], tmp_path)
    c = a.contract
    assert c.behaviours == {"empty_rows": "mean_of_values", "compute_dtype": "float32", "scale_rounding": "input_dtype"}
    top, causal, half = c.limits
    assert (top.q_multiple, top.k_multiple, top.grads_multiple, top.equal_when_causal) == (128, 64, 32, True)
    assert causal.when == (("causal", True),) and causal.q_multiple == causal.k_multiple == 16
    assert half.when == (("grads", True), ("dtype", ("float16", "bfloat16"))) and half.grads_multiple == 128
    assert c.unsupported_raises == ("ValueError", "mylib.Unsupported") and c.representations == {"contiguous"}
    assert "noncontiguous" not in a.capabilities and "broadcast_kv" not in a.capabilities   # layouts it does not take
    assert [e["id"] for e in declared.entries(a)] == ["DECLARED-EMPTY-ROWS", "DECLARED-EMPTY-ROWS-GRADS",
                                                      "DECLARED-COMPUTE-DTYPE", "DECLARED-COMPUTE-DTYPE-GRADS",
                                                      "DECLARED-SCALE-ROUNDING"]
    assert _load(f"{SDPA}:empty_rows_nan", ["seqlen_multiple = 64"], tmp_path).contract.limits[0].q_multiple == 64


@pytest.mark.parametrize("line, message", [
    ('empty_rows = "mean"', "'empty_rows' must be one of 'nan', 'zero', 'mean_of_values'; got 'mean'"),
    ('compute_dtype = "float8"', "'compute_dtype' must be one of"),
    ('scale_rounding = "float32"', "'scale_rounding' must be one of 'input_dtype'"),
    ("seqlen_multiple = 0", "'seqlen_multiple' must be a positive integer; got 0"),
    ("seqlen_multiple = {q = 64, n = 3}", "'seqlen_multiple' as a table takes q and/or k"),
    ('causal_equal_lengths = "yes"', "'causal_equal_lengths' must be true or false"),
    ("grads_seqlen_multiple = {q = 8, k = 16}", "'grads_seqlen_multiple' is one integer"),
    ('unsupported_raises = "ValueError"', "'unsupported_raises' must be a list of exception type names"),
    ('representations = ["paged"]', "unknown representation(s) paged for the sdpa convention"),
    ("[[when]]\ncausal = 1\nseqlen_multiple = 8", "when[0]: 'causal' must be true or false"),
    ("[[when]]\ncausal = true\nmax_heads = 8", "when[0]: unknown key(s) max_heads"),
    ("[[when]]\nseqlen_multiple = 8", "when[0]: names no condition"),
    ('[[when]]\ndtype = "float8"\nseqlen_multiple = 8', "when[0]: 'dtype' must be a dtype name"),
    ("[[when]]\ncausal = true", "when[0]: states no limit"),
])
def test_bad_values_are_one_line_errors(tmp_path, line, message):
    with pytest.raises(adapters.UsageError) as info:
        _load(f"{SDPA}:empty_rows_nan", [line], tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_limits_refuse_with_a_message_naming_the_limit():
    a = adapters.load("torch", kernel=f"{SDPA}:multiple_of_16")[0]
    assert "Lq and Lk multiples of 16" in a.supports(_case(5, 5)) and "Lq=5, Lk=5" in a.supports(_case(5, 5))
    assert a.supports(_case(16, 32)) is True
    assert "causal only with Lq == Lk" in a.supports(_case(16, 32, causal="top_left"))
    b = adapters.load("torch", kernel=f"{SDPA}:noncausal_q128_padded_keys_bug")[0]
    assert "Lq a multiple of 128 (when causal = false)" in b.supports(_case(5, 37))
    assert b.supports(_case(5, 37, causal="top_left")) is True and b.supports(_case(128, 37)) is True


def test_grads_and_dtype_conditions(tmp_path):
    a = _load(f"{SDPA}:empty_rows_nan", ["grads_seqlen_multiple = 8", "[[when]]", 'dtype = "float16"',
                                         "seqlen_multiple = 4"], tmp_path)
    assert a.supports(_case(5, 5)) is True
    assert "gradients only with Lq and Lk multiples of 8" in a.supports(_case(5, 5), need=frozenset({"grads"}))
    assert "(when dtype = float16)" in a.supports(_case(5, 5, dtype="float16"))


def test_fit_moves_cases_into_the_limits():
    a = adapters.load("torch", kernel=f"{SDPA}:multiple_of_16")[0]
    rng = np.random.default_rng(1)
    mask = rng.random((5, 37)) > 0.3
    f = fit(_case(5, 37, mask=mask, kv_lengths=np.array([30])), a, record=False)
    assert (f.shape["Lq"], f.shape["Lk"]) == (16, 48) and f.mask.shape == (16, 48)
    assert (f.mask[:5, :37] == mask).all() and f.mask[5:].all() and f.kv_lengths.tolist() == [30]
    f = fit(_case(5, 37, causal="bottom_right"), a, record=False)
    assert (f.shape["Lq"], f.shape["Lk"]) == (16, 16) and f.causal == "bottom_right"
    assert fit(f, a, record=False) is f                       # idempotent: a supported case comes back as itself
    b = adapters.load("torch", kernel=f"{SDPA}:noncausal_q128_padded_keys_bug")[0]
    f = fit(_case(7, 50), b, record=False)
    assert (f.shape["Lq"], f.shape["Lk"]) == (128, 50)      # the case: non-causal, Lq = 128, Lk = 50


def test_generation_draws_inside_the_limits():
    """The strategies fit drawn lengths into the limits: every non-causal case of the kernel whose bug needs
    Lq = 128 with Lk off the block is drawn with Lq a multiple of 128 about half the time, Lk left free."""
    from hypothesis import HealthCheck, given, settings

    from attnconf.conformance import strategies as st
    from attnconf.conformance.engine.harness import scope_of

    b = adapters.load("torch", kernel=f"{SDPA}:noncausal_q128_padded_keys_bug")[0]
    seen = []

    @settings(max_examples=60, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.shapes())
    def draw(s):
        seen.append((s["Lq"], s["Lk"]))

    with st.cell("float32", scope_of(b)):
        draw()
    fitted = [(lq, lk) for lq, lk in seen if lq % 128 == 0]
    assert len(fitted) >= len(seen) // 4
    assert any(lk % 64 for _, lk in fitted)


def test_declared_exceptions_mean_unsupported():
    a = adapters.load("torch", kernel=f"{SDPA}:multiple_of_16")[0]
    a.contract = ct.Contract(unsupported_raises=("ValueError",), source="test")   # no limits: the kernel refuses
    with pytest.raises(NotSupported, match="raised ValueError: sequence lengths must be multiples of 16"):
        a.run(_case(5, 5))
    a.contract = None
    from attnconf.adapters.base import KernelError

    with pytest.raises(KernelError):
        a.run(_case(5, 5))


def test_kvcache_representations(tmp_path):
    caps = tmp_path / "kv.toml"
    caps.write_text('representations = ["contiguous", "page_size_256"]\n')
    a = adapters.load("torch", kernel="tests.kernels.flash:flash_attn_with_kvcache", convention="flash_attn_kvcache",
                      capabilities=str(caps))[0]
    from attnconf.adapters.conventions.flash_attn_kvcache import representation

    reps = [representation(_case(5, 9, seed=s), a.capabilities, a.contract) for s in range(40)]
    assert not any(r.batch_idx for r in reps) and {r.page_size for r in reps} == {0, 256}
    refused = a.supports(_case(5, 9, packing={"cache_batch_idx": True}))
    assert "this case uses cache_batch_idx" in refused
    assert "page_size_512" in a.supports(_case(5, 9, packing={"page_size": 512}))
    b = adapters.load("torch", kernel="tests.kernels.flash:flash_attn_with_kvcache", convention="flash_attn_kvcache",
                      capabilities=str(_toml(tmp_path, 'representations = ["contiguous"]')))[0]
    assert "paged" not in b.capabilities


def _toml(tmp_path, text):
    p = tmp_path / "more.toml"
    p.write_text(text + "\n")
    return p


def test_compute_dtype_is_judged_at_that_precision():
    """A float32 case of a kernel that computes in bfloat16 fails the float32 tolerance and passes the
    bfloat16 one: the declaration is what certifies it."""
    a = adapters.load("torch", kernel=f"{SDPA}:computes_bfloat16")[0]
    case = _case(24, 40, seed=3)
    res = a.run(case)
    entry = declared.entries(a)[0]
    masks = {"out": np.ones(res.out.shape, bool)}
    assert not alternatives.conforms(case, res, masks)
    assert alternatives.check(entry, case, res, masks).ok
    wrong = np.asarray(res.out) * 1.5
    assert not alternatives.check(entry, case, type(res)(out=wrong, out_dtype="float32"), masks).ok


def test_scale_rounding_and_empty_rows_entries():
    a = adapters.load("torch", kernel=f"{SDPA}:empty_rows_nan")[0]
    case = _case(6, 6, dtype="float32", mask=np.tril(np.ones((6, 6), bool), -1))   # row 0 sees no key
    res = a.run(case)
    entry = declared.entries(a)[0]
    rows = np.zeros((1, 2, 6), bool)
    rows[:, :, 0] = True
    masks = {"out": np.broadcast_to(rows[..., None], res.out.shape).copy()}
    assert entry["region"] == "fully_masked_rows" and alternatives.check(entry, case, res, masks).ok
    zero = {**entry, "instead": "zero_rows"}
    assert not alternatives.check(zero, case, res, masks).ok
    from attnconf.adapters.base import Result

    spec = alternatives.check(zero, case, Result(out=np.where(masks["out"], 0.0, res.out), out_dtype="float32"), masks)
    assert spec.ok and spec.detail == "conforms to the spec here"      # "zero" is the spec's value: not divergent
    from attnconf.conformance.engine.regions import REGIONS

    assert REGIONS["scale_changed_by_input_dtype"](_case(dtype="bfloat16", scale=0.3))
    assert not REGIONS["scale_changed_by_input_dtype"](_case(dtype="bfloat16", scale=0.25))


def test_flashinfer_layouts(tmp_path):
    caps = _toml(tmp_path, 'representations = ["NHD", "contiguous"]')
    a = adapters.load("torch", kernel="tests.kernels.flash:single_prefill_with_kv_cache",
                      convention="flashinfer_prefill", capabilities=str(caps))[0]
    from attnconf.adapters.conventions.flashinfer_prefill import kv_layout

    assert {kv_layout(_case(seed=s), a.contract) for s in range(20)} == {"NHD"}
    assert "this case uses HND" in a.supports(_case(packing={"kv_layout": "HND"}))
    assert "noncontiguous" not in a.capabilities


def test_certificate_states_each_declaration():
    from attnconf.reports.certificate import declared_lines

    base = {"clause": "ATTN-EMPTY-1", "declared": 'empty_rows = "nan"', "contradicted": False}
    cert = {"divergences": [{**base, "id": "DECLARED-EMPTY-ROWS", "examples": 12},
                            {**base, "id": "DECLARED-EMPTY-ROWS-GRADS", "examples": 0},
                            {**base, "id": "DECLARED-SCALE-ROUNDING", "examples": 3, "contradicted": True},
                            {"id": "TORCH-X", "clause": "ATTN-OP-1", "examples": 4}],
            "scopes": {"k": {"declared": {"contract": {"limits": ["Lq and Lk multiples of 64"]}}}}}
    text = "\n".join(declared_lines(cert))
    assert "DECLARED-EMPTY-ROWS, ATTN-EMPTY-1): checked on 12 example(s)" in text
    assert "DECLARED-EMPTY-ROWS-GRADS, ATTN-EMPTY-1): never exercised" in text
    assert "DECLARED-SCALE-ROUNDING, ATTN-EMPTY-1): contradicted" in text and "TORCH-X" not in text
    assert "declared limit of k: Lq and Lk multiples of 64" in text
