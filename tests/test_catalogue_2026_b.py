"""The catalogue of issue 26 part b (tests/kernels/kernels2026_b.py): MLA, sparse top-k, FlashInfer's paged
batch wrappers. The suite must pass the controls and catch each one-defect kernel on the clause of its defect.

- fast: each control agrees with the float64 reference through its convention's adapter on cases
  chosen for the convention (empty rows, partial pages, NHD and HND, duplicates, sinks); each bug
  differs from the reference on a witness case built for its defect (or breaks its convention
  there), so a bug the suite misses is the suite's gap, not a dud bug;
- slow: the suite runs on the controls (each must end CONFORMANT) and, restricted to the module that
  states the bug's clause, on each bug (`-x`): it must fail, on that clause.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="the catalogue is written in torch, which is not installed")

if importlib.util.find_spec("torch") is not None:
    from attnconf import adapters
    from attnconf.adapters.base import ConventionViolation
    from attnconf.reference import Case, oracle
    from attnconf.reference.sparse import max_logits as reference_max_logits
    from bench.runner import run_suite
    from tests.kernels import kernels2026_b as kb
    from tests.test_catalogue_conventions import allowed

    BUGS = sorted(kb.BUGS)
else:  # collected but skipped
    BUGS = []

MODULE = "tests.kernels.kernels2026_b"


def adapter(name: str, convention: str):
    return adapters.load("torch", kernel=f"{MODULE}:{name}", convention=convention)[0]


def case(seed=0, *, B=2, Hq=4, Hkv=2, Lq=7, Lk=9, D=8, Dv=None, dtype="float32", q_mult=1.0, **params) -> "Case":
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv or D)))
    return Case.build(q_mult * q, k, v, dtype=dtype, seed=seed, **params)


def native_mla(seed=0, *, B=2, Lq=2, Lk=70, dtype="bfloat16", **params) -> "Case":
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, 1, Lk, 576)) / 4
    return Case.build(rng.standard_normal((B, 2, Lq, 576)) / 4, k, k[..., :512].copy(), dtype=dtype, seed=seed,
                      **params)


SINKS = np.array([0.5, -1.0, 2.0, 0.0])
CONTROL_CASES = {
    "flashmla_kvcache": [lambda d: case(1, Lq=1, Lk=70, kv_lengths=[0, 65], dtype=d),
                         lambda d: case(2, Lq=5, Lk=130, causal="bottom_right", kv_lengths=[3, 130], dtype=d),
                         lambda d: case(3, Dv=16, scale=0.4, packing={"latent_offset": 576 - 8}, dtype=d),
                         lambda d: native_mla(4, causal="bottom_right", kv_lengths=[1, 70], dtype=d)],
    "flashmla_sparse": [lambda d: case(5, causal="top_left", q_lengths=[7, 3], kv_lengths=[2, 9], dtype=d),
                        lambda d: case(6, Lq=9, Lk=4, causal="bottom_right", sinks=SINKS, dtype=d),
                        lambda d: case(7, window=(2, 1), window_align="top_left",
                                       packing={"sparse_duplicates": True}, dtype=d),
                        lambda d: case(8, mask=np.random.default_rng(8).random((2, 1, 7, 9)) < 0.4, dtype=d)],
    "flashinfer_batch_prefill": [
        lambda d: case(9, causal="bottom_right", q_lengths=[7, 2], kv_lengths=[0, 9], packing={"page_size": 4}, dtype=d),
        lambda d: case(10, softcap=1.0, q_mult=4.0, window=(2, -1), packing={"kv_layout": "HND", "page_size": 1},
                       dtype=d),
        lambda d: case(11, mask=np.random.default_rng(11).random((2, 1, 7, 9)) < 0.6,
                       packing={"page_size": 17, "kv_cache_format": "single"}, dtype=d),
        lambda d: case(12, Lq=5, Lk=40, kv_lengths=[33, 17], packing={"page_size": 16, "kv_layout": "HND"}, dtype=d)],
    "flashinfer_batch_decode": [
        lambda d: case(13, Lq=1, Lk=17, window=(5, -1), kv_lengths=[0, 13], packing={"page_size": 5}, dtype=d),
        lambda d: case(14, Lq=1, softcap=2.0, q_mult=3.0, packing={"kv_layout": "HND", "page_size": 3}, dtype=d),
        lambda d: case(15, Lq=1, Lk=40, Hkv=1, scale=0.7, packing={"page_size": 16, "kv_cache_format": "tuple"},
                       dtype=d)],
}
SPARSE_TOP = 128


@pytest.mark.parametrize("name", sorted(kb.CONTROLS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_control_matches_reference(name, dtype):
    conv = kb.CONTROLS[name]
    a = adapter(name, conv)
    for i, build in enumerate(CONTROL_CASES[conv]):
        c = build(dtype)
        assert a.supports(c) is True, f"{name} case {i}: {a.supports(c)}"
        res, ref = a.run(c), oracle(c)
        err = float(np.abs(res.out - ref.out).max(initial=0.0))
        assert err <= allowed(c, res), f"{name} case {i} {dtype}: error {err:.3g} > {allowed(c, res):.3g}"
        if res.lse is not None:
            finite = np.isfinite(ref.lse)
            assert np.array_equal(np.isfinite(res.lse), finite) and np.array_equal(res.lse[~finite], ref.lse[~finite])
            lerr = float(np.abs(res.lse[finite] - ref.lse[finite]).max(initial=0.0))
            assert lerr <= 1e-5 * (1 + float(np.abs(ref.lse[finite]).max(initial=0.0))), f"{name} case {i}: lse {lerr:.3g}"


# ---- every bug shows on its witness -------------------------------------------------------------
WITNESSES = {
    "mla_v_from_latent_end": (lambda: case(Lq=1, Lk=9), "out"),
    "mla_score_without_rope": (lambda: case(Lq=1, Lk=9, packing={"latent_offset": 576 - 8}), "out"),
    "mla_last_page_full": (lambda: case(Lq=1, Lk=9), "out"),
    "mla_empty_lse_neg_inf": (lambda: case(Lq=1, Lk=9, kv_lengths=[0, 9]), "violation:ATTN-LSE-2"),
    "sparse_negative_index_wraps": (lambda: case(), "out"),
    "sparse_duplicates_twice": (lambda: case(packing={"sparse_duplicates": True}), "out"),
    "sparse_out_of_range_clamped": (lambda: case(), "out"),
    "sparse_lse_base2": (lambda: case(), "lse"),
    "sparse_max_logits_unscaled": (lambda: case(scale=0.25), "max_logits"),
    "prefill_page_size_16": (lambda: case(packing={"page_size": 3}), "out"),
    "prefill_last_page_full": (lambda: case(packing={"page_size": 5}), "out"),
    "prefill_softcap_after_mask": (lambda: case(Lq=9, Lk=9, causal="bottom_right", softcap=1.0), "out"),
    "prefill_next_page_read": (lambda: case(packing={"page_size": 3}), "out"),
    "prefill_hnd_read_as_nhd": (lambda: case(packing={"kv_layout": "HND", "page_size": 4}), "out"),
    "decode_last_page_full": (lambda: case(Lq=1, packing={"page_size": 5}), "out"),
    "decode_page_size_16": (lambda: case(Lq=1, Lk=20, packing={"page_size": 3}), "out"),
    "decode_softcap_after_mask": (lambda: case(Lq=1, Lk=12, window=(3, -1), softcap=1.0), "out"),
}


@pytest.mark.parametrize("name", BUGS)
def test_bug_shows_on_its_witness(name):
    fn = kb.BUGS[name]
    build, kind = WITNESSES[name]
    c = build()
    a = adapter(name, fn.convention)
    assert a.supports(c) is True, f"{name}: the witness is outside the convention: {a.supports(c)}"
    if kind.startswith("violation:"):
        with pytest.raises(ConventionViolation) as info:
            a.run(c)
        assert info.value.clause == kind.split(":")[1]
        return
    res, ref = a.run(c), oracle(c)
    got, want = {"out": (res.out, ref.out), "lse": (res.lse, ref.lse),
                 "max_logits": (res.notes.get("max_logits"), reference_max_logits(ref))}[kind]
    with np.errstate(invalid="ignore"):
        err = np.abs(np.where(np.isneginf(want), 0, got) - np.where(np.isneginf(want), 0, want))
    worst = np.inf if not np.isfinite(err).all() else float(err.max())
    assert worst > 10 * allowed(c, res), f"{name}: differs by only {worst:.3g}"


def test_catalogue_is_complete():
    from attnconf import spec
    from attnconf.adapters import conventions

    assert set(WITNESSES) == set(BUGS) and len(BUGS) >= 15
    for name in BUGS:
        fn = kb.BUGS[name]
        assert fn.clause in spec.clauses() and fn.convention in conventions.NAMES and fn.__doc__.startswith("Defect")
    assert {kb.BUGS[b].convention for b in BUGS} == set(kb.FACTORIES) <= set(conventions.NAMES)


# ---- the suite against the catalogue (slow) -------------------------------------------------------
# the module that states each bug's clause: the bug's run is restricted to it, so the failure's clause is its own
STATED_IN = {"ATTN-MLA-1": "test_mla", "ATTN-SPARSE-1": "test_sparse", "ATTN-SPARSE-2": "test_sparse",
             "ATTN-SPARSE-3": "test_sparse", "ATTN-PAGED-4": "test_paged_batch", "ATTN-CAP-1": "test_softcap",
             "ATTN-LSE-1": "test_lse_conventions", "ATTN-LSE-2": "test_lse_conventions"}
# one bug per clause and convention (make test-catalogue); the others are shown on their witnesses above
SUITE_BUGS = ["mla_score_without_rope", "sparse_negative_index_wraps", "sparse_duplicates_twice",
              "sparse_max_logits_unscaled", "prefill_page_size_16", "decode_last_page_full",
              "prefill_softcap_after_mask"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SUITE_BUGS)
def test_suite_catches_bug_on_its_clause(name, tmp_path):
    fn = kb.BUGS[name]
    run = run_suite("torch", tmp_path / "run.json", kernel=f"{MODULE}:{name}", stop_at_first=True,
                    extra=(f"--convention={fn.convention}", "-k", STATED_IN[fn.clause]))
    assert run.report is not None, run.output_tail
    assert run.returncode == 1, f"the suite did not catch {name} ({fn.clause}):\n{run.output_tail}"
    assert fn.clause in run.report["verdict"]["failed_clauses"], (run.report["verdict"]["failed_clauses"], name)


# a full ci run per control, 220 to 800 s each on this 2-core machine under load: make test-long
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name", sorted(kb.CONTROLS))
def test_suite_judges_control_conformant(name, tmp_path):
    run = run_suite("torch", tmp_path / "run.json", kernel=f"{MODULE}:{name}",
                    extra=(f"--convention={kb.CONTROLS[name]}",))
    assert run.report is not None, run.output_tail
    assert run.returncode == 0 and run.report["verdict"]["verdict"] == "CONFORMANT", \
        f"{name}: {run.first_failure}\n{run.output_tail}"
