"""The convention catalogue: the suite must fail every planted bug and pass every correct kernel.

Same two layers as tests/test_catalogue.py, for the flash-attention and FlashInfer
conventions (tests/kernels/flash.py, tests/kernels/flash_buggy.py):

- fast: the correct kernels agree with the float64 reference through their adapters, and
  every buggy kernel differs from it on a witness case built for its defect (or breaks its
  convention there, or refuses what it declares), so a bug the suite misses is the suite's
  gap, not a dud bug;
- slow: the real suite runs on each kernel in a subprocess (`pytest conformance
  --backend=torch --kernel=... --convention=... -x`) and records which test caught it, after
  how many examples and seconds; each correct kernel must end CONFORMANT.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from attnconf.spec.vocabulary import DTYPES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="the convention catalogue is written in torch, which is not installed")

if importlib.util.find_spec("torch") is not None:
    from attnconf import adapters
    from attnconf.adapters.base import ConventionViolation, NotSupported
    from attnconf.reference import Case, oracle
    from bench.runner import run_suite
    from tests.kernels import flash_buggy

    BUGS = sorted(flash_buggy.BUGS)
else:  # collected but skipped
    BUGS = []

ROOT = Path(__file__).resolve().parent.parent
CORRECT = {"flash_attn_func": "flash_attn", "flash_attn_varlen_func": "flash_attn_varlen",
           "flash_attn_with_kvcache": "flash_attn_kvcache", "single_prefill_with_kv_cache": "flashinfer_prefill",
           "single_decode_with_kv_cache": "flashinfer_decode", "flash_attn_func_half": "flash_attn"}
# independently written controls (tests/kernels/flash_alt.py): batched, padded, torch.softmax / logsumexp
ALT = {"flash_attn_func": "flash_attn", "flash_attn_varlen_func": "flash_attn_varlen",
       "flash_attn_with_kvcache": "flash_attn_kvcache"}
CONTROLS = [("flash", n) for n in sorted(CORRECT)] + [("flash_alt", n) for n in sorted(ALT)]
EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def adapter(module: str, name: str, convention: str):
    return adapters.load("torch", kernel=f"tests.kernels.{module}:{name}", convention=convention)[0]


def case(seed=0, *, B=2, Hq=4, Hkv=2, Lq=7, Lk=9, D=8, dtype="float32", q_mult=1.0, **params) -> "Case":
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
    return Case.build(q_mult * q, k, v, dtype=dtype, seed=seed, **params)


def allowed(c: "Case", res) -> float:
    """What a correct kernel computing in float32 (float64 for float64) may err by: rounding the output to
    the dtype plus float32 arithmetic over Lk terms, at the magnitude of V (a derived bound, no fitting)."""
    vmax = float(np.abs(c.v).max(initial=0.0))
    compute = EPS["float64"] if c.dtype == "float64" else EPS["float32"]
    return vmax * (2 * EPS[c.dtype] + 4 * (c.shape["Lk"] + c.shape["Dk"]) * compute)


# ---- the correct kernels agree with the reference (fast) ---------------------------------------
CONTROL_CASES = {
    "plain": dict(),
    "causal_cross": dict(causal="bottom_right", Lq=5, Lk=11),
    "causal_empty_rows": dict(causal="bottom_right", Lq=11, Lk=5),
    "window": dict(window=(2, 1), Lq=9, Lk=9),
    "window_left": dict(window=(3, -1), Lq=5, Lk=11),
    "window_causal": dict(window=(2, 4), causal="bottom_right"),
    "softcap": dict(softcap=1.0, q_mult=4.0),
    "alibi": dict(alibi_slopes=np.array([1.0, 0.5, 0.25, 0.125])),
    "alibi_batch_causal": dict(alibi_slopes=np.array([[0.3, 0.9, 0.1, 1.2], [1.5, 0.1, 0.7, 0.2]]), causal="bottom_right"),
    "lengths": dict(kv_lengths=[0, 6], q_lengths=[7, 3], causal="bottom_right"),
    "mask": dict(mask=np.random.default_rng(3).random((2, 1, 7, 9)) < 0.6),
    "decode": dict(Lq=1, Lk=17, window=(5, -1)),
    "decode_softcap_lengths": dict(Lq=1, Lk=13, softcap=2.0, q_mult=3.0, kv_lengths=[0, 9]),
    "decode_scale": dict(Lq=1, Lk=5, scale=0.7, Hkv=1),
    "scale": dict(scale=0.3, layout="noncontiguous"),
}


@pytest.mark.parametrize("module, name", CONTROLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_kernel_matches_reference(module, name, dtype):
    a = adapter(module, name, CORRECT[name])
    ran = 0
    for i, (kind, params) in enumerate(sorted(CONTROL_CASES.items())):
        c = case(i, dtype=dtype, **params)
        if a.supports(c) is not True:
            continue
        ran += 1
        res = a.run(c)
        ref = oracle(c)
        err = float(np.abs(res.out - ref.out).max(initial=0.0))
        assert err <= allowed(c, res), f"{name} {kind} {dtype}: error {err:.3g} > {allowed(c, res):.3g}"
        if res.lse is not None:
            finite = np.isfinite(ref.lse)
            assert (np.isneginf(res.lse) == ~finite).all(), f"{name} {kind}: empty-row lse"
            lerr = float(np.abs(res.lse[finite] - ref.lse[finite]).max(initial=0.0))
            logits = float(np.abs(np.where(ref.visible, ref.logits, 0.0)).max(initial=0.0))
            bound = 4 * (c.shape["Lk"] + c.shape["Dk"]) * EPS["float32"] * (1 + logits + float(np.abs(ref.lse[finite]).max(initial=0.0)))
            assert lerr <= bound, f"{name} {kind}: lse error {lerr:.3g} > {bound:.3g}"
    if dtype in a.dtypes:
        assert ran >= 3, f"{name} ran only {ran} control cases in {dtype}"
    else:
        assert ran == 0


def test_controls_have_gradients_where_the_convention_does():
    for module, name in [("flash", "flash_attn_func"), ("flash", "flash_attn_varlen_func"),
                         ("flash_alt", "flash_attn_func"), ("flash_alt", "flash_attn_varlen_func")]:
        a = adapter(module, name, CORRECT[name])
        c = case(5, grad_out=np.random.default_rng(5).standard_normal((2, 4, 7, 8)), window=(2, 1), softcap=2.0,
                 alibi_slopes=np.array([1.0, 0.5, 0.25, 0.125]), dtype="float64")
        from attnconf.reference import backward

        res = a.run(c, grads=True)
        ref = backward(c)
        for g in ("dq", "dk", "dv"):
            assert np.abs(res.grads[g] - getattr(ref, g)).max() < 1e-10, (name, g)


# ---- every bug shows on its witness (fast) ------------------------------------------------------
def _varlen(**kw):
    return case(**{"packing": {"seq_order": [0, 1]}, **kw})


WITNESSES = {
    "window_left_exclusive": (lambda: case(window=(2, 1)), "out"),
    "window_right_exclusive": (lambda: case(window=(2, 2)), "out"),
    "window_top_left": (lambda: case(Lq=5, Lk=11, window=(1, 1)), "out"),
    "causal_top_left": (lambda: case(Lq=5, Lk=11, causal="bottom_right"), "out"),
    "softcap_after_mask": (lambda: case(Lq=9, Lk=9, causal="bottom_right", softcap=1.0), "out"),
    "softcap_ignored": (lambda: case(softcap=1.0, q_mult=4.0), "out"),
    "alibi_sign": (lambda: case(alibi_slopes=np.ones(4)), "out"),
    "alibi_top_left": (lambda: case(Lq=5, Lk=11, alibi_slopes=np.ones(4)), "out"),
    "alibi_no_abs": (lambda: case(alibi_slopes=np.ones(4)), "out"),
    "alibi_ignored": (lambda: case(alibi_slopes=np.ones(4)), "out"),
    "gqa_tile": (lambda: case(Hq=4, Hkv=2), "out"),
    "lse_base2": (lambda: case(), "lse"),
    "lse_empty_neg_inf": (lambda: case(Lq=9, Lk=4, causal="bottom_right"), "violation:ATTN-LSE-2"),
    "dropout_ignored": (lambda: case(B=1, Hq=1, Hkv=1, Lq=4, Lk=8, dtype="float64", dropout_p=0.5), "dropout"),
    "varlen_global_offset": (lambda: _varlen(q_lengths=[3, 7], kv_lengths=[9, 4], causal="bottom_right"), "out"),
    "varlen_leaky": (lambda: _varlen(kv_lengths=[3, 9]), "out"),
    "varlen_empty_nan": (lambda: _varlen(q_lengths=[7, 2], kv_lengths=[3, 4], causal="bottom_right"), "out"),
    "kvcache_append_off_by_one": (lambda: case(packing={"new_keys": 2, "page_size": 0, "spare_slots": 2}),
                                  "violation:ATTN-PAGED-3"),
    "kvcache_new_keys_ignored": (lambda: case(packing={"new_keys": 2, "page_size": 0}), "out"),
    "paged_block_table_ignored": (lambda: case(Lk=300, packing={"page_size": 256, "block_seed": 1, "new_keys": 0}),
                                  "out"),
    "kvcache_one_key_short": (lambda: case(packing={"new_keys": 1, "page_size": 0}), "out"),
    "paged_page_start_in_previous_block": (lambda: case(Lk=300, packing={"page_size": 256, "block_seed": 1,
                                                                         "new_keys": 0}), "out"),
    "flashinfer_lse_natural": (lambda: case(), "lse"),
    "flashinfer_window_exclusive": (lambda: case(Lq=9, Lk=9, window=(2, -1)), "out"),
    "flashinfer_mask_ignored": (lambda: case(mask=np.random.default_rng(1).random((2, 1, 7, 9)) < 0.5), "out"),
    "decode_one_key_short": (lambda: case(Lq=1, Lk=9), "out"),
    "declares_float32_unimplemented": (lambda: case(dtype="float32"), "unsupported"),
    "window_block_skip": (lambda: case(B=1, Lq=200, Lk=300, window=(16, -1)), "out"),
    "probs_path_unnormalised": (lambda: case(), "out_with_lse"),
    "lse_in_input_dtype": (lambda: case(dtype="bfloat16"), "violation:ATTN-LSE-1"),
    "varlen_even_k_global": (lambda: _varlen(Lk=64, kv_lengths=[10, 64]), "out"),
    "wide_v_stale_rescale": (lambda: case(B=1, Hq=2, Hkv=2, Lq=16, Lk=200, D=256, scale=1.0), "out"),
}


@pytest.mark.parametrize("name", BUGS)
def test_bug_shows_on_its_witness(name):
    fn = flash_buggy.BUGS[name]
    build, kind = WITNESSES[name]
    c = build()
    a = adapter("flash_buggy", name, fn.convention)
    assert a.supports(c) is True, f"{name}: the witness is outside the convention: {a.supports(c)}"
    if kind.startswith("violation:"):
        with pytest.raises(ConventionViolation) as info:
            a.run(c)
        assert info.value.clause == kind.split(":")[1]
        return
    if kind == "unsupported":
        with pytest.raises(NotSupported):
            a.run(c)
        return
    if kind == "dropout":
        outs = np.stack([a.run(c.replace(seed=s)).out for s in range(20)])
        assert (outs == outs[0]).all()                 # nothing is ever dropped
        assert np.abs(outs[0] - oracle(c.replace(dropout_p=0.0)).out).max() < 1e-12
        return
    res = a.run(c)
    ref = oracle(c)
    got, want = {"out": (res.out, ref.out), "out_with_lse": (res.out_with_lse, ref.out)}.get(kind, (res.lse, ref.lse))
    with np.errstate(invalid="ignore"):
        err = np.abs(np.where(np.isneginf(want), 0, got) - np.where(np.isneginf(want), 0, want))
    worst = np.inf if not np.isfinite(err).all() else float(err.max())
    assert worst > 10 * allowed(c, res), f"{name}: differs by only {worst:.3g}"


def test_catalogue_is_complete():
    import tomllib

    from attnconf.adapters import conventions

    clauses = {c["id"] for c in tomllib.loads((ROOT / "spec" / "clauses.toml").read_text())["clause"]}
    assert len(BUGS) >= 15
    assert set(WITNESSES) == set(BUGS)
    for name in BUGS:
        fn = flash_buggy.BUGS[name]
        assert fn.clause in clauses and fn.convention in conventions.NAMES and "Defect" in fn.__doc__, name
    # the conventions of issue 26 have their own catalogues (tests/kernels/kernels2026_*.py)
    assert {flash_buggy.BUGS[b].convention for b in BUGS} == set(CORRECT.values()) <= set(conventions.NAMES)


# ---- the suite against the catalogue (slow: one suite run per kernel) ------------------------------
# The second implementation of each convention (flash_alt) costs about 100 s per suite run: `make test-long`.
LONG = {("flash_alt", n) for n in ALT}


def _control(module: str, name: str):
    marks = [pytest.mark.long] if (module, name) in LONG else []
    return pytest.param(module, name, marks=marks, id=f"{module}-{name}")


@pytest.mark.slow
@pytest.mark.parametrize("module, name", [_control(m, n) for m, n in CONTROLS]
                         + [("flash", "flash_attn_func_half_undeclared")])
def test_suite_judges_correct_kernel(module, name, tmp_path):
    conv = CORRECT.get(name, "flash_attn")
    undeclared = name.endswith("_undeclared")     # must fail: its first failure is enough
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.{module}:{name}",
                    stop_at_first=undeclared, extra=(f"--convention={conv}",))
    assert run.report is not None, run.output_tail
    if name.endswith("_undeclared"):   # the half-precision kernel without its declaration must not pass
        assert run.returncode == 1 and run.report["verdict"]["verdict"] == "NONCONFORMANT", run.output_tail
    else:
        assert run.returncode == 0 and run.report["verdict"]["verdict"] == "CONFORMANT", \
            f"{name} failed: {run.first_failure}\n{run.output_tail}"


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_suite_catches_bug(name, tmp_path, record_property):
    fn = flash_buggy.BUGS[name]
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.flash_buggy:{name}",
                    stop_at_first=True, extra=(f"--convention={fn.convention}",))
    assert run.report is not None, run.output_tail
    f = run.first_failure or {}
    record_property("caught_by", run.caught_by)
    record_property("examples", f.get("examples"))
    record_property("seconds", round(run.wall_s, 1))
    print(f"{name}: caught by {run.caught_by} after {f.get('examples')} examples, {run.wall_s:.1f} s wall")
    assert run.returncode == 1, f"the suite did not catch {name} ({fn.clause}):\n{run.output_tail}"
