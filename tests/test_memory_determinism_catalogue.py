"""ATTN-MEM-1 and ATTN-DET-1 each catch their one-defect kernels; the controls pass (issue 25, items 5, 6).

Fast: each poison kernel returns NaN through its convention where the reference is finite (the unread
positions hold NaN) while its correct original does not; the nondeterministic kernel's two calls
differ; a declaration `deterministic = false` is parsed, reaches the scope and the certificate's words.
Slow: the suite itself (`-k` the clause's test, first failure) fails each kernel on its clause and
passes the controls.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from attnconf.adapters.scope import Scope, ScopeError, parse, scope_sentence
from attnconf.reference import Case, oracle

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the kernels are written in torch")

if importlib.util.find_spec("torch") is not None:
    from attnconf import adapters
    from tests.kernels import determinism_bugs, poison_bugs

CONTROL = {"flash_attn_kvcache": "flash_attn_with_kvcache", "flash_attn_varlen": "flash_attn_varlen_func",
           "flashinfer_decode": "single_decode_with_kv_cache"}


def case(seed=0, *, B=2, Hq=4, Hkv=2, Lq=7, Lk=9, D=8, **params) -> Case:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
    return Case.build(q, k, v, dtype="float32", seed=seed, **params)


WITNESSES = {
    "kvcache_last_tile_whole": [case(packing={"new_keys": 2, "page_size": 0, "spare_slots": 2}),
                                case(Lk=300, packing={"page_size": 256, "block_seed": 1, "new_keys": 0})],
    "varlen_last_tile_whole": [case(packing={"seq_order": [0, 1]}, kv_lengths=[3, 9])],
    "decode_reads_past_the_end": [case(Lq=1, Lk=9)],
}


def test_poison_catalogue_is_complete():
    assert set(WITNESSES) == set(poison_bugs.BUGS)
    assert {fn.convention for fn in poison_bugs.BUGS.values()} == set(CONTROL)


@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_poison_bug_shows_nan_and_its_original_does_not(name):
    fn = poison_bugs.BUGS[name]
    bad = adapters.load("torch", kernel=f"tests.kernels.poison_bugs:{name}", convention=fn.convention)[0]
    good = adapters.load("torch", kernel=f"tests.kernels.flash:{CONTROL[fn.convention]}", convention=fn.convention)[0]
    for c in WITNESSES[name]:
        assert bad.supports(c) is True and np.isfinite(oracle(c).out).all()
        assert np.isnan(bad.run(c).out).any(), f"{name}: no NaN on its witness"
        assert np.abs(good.run(c).out - oracle(c).out).max() < 1e-5


def test_nondeterministic_kernel_differs_between_calls():
    import torch

    q, k, v = (torch.randn(1, 2, 33, 16) for _ in range(3))
    a, b = (determinism_bugs.random_key_order(q, k, v, is_causal=True) for _ in range(2))
    assert not torch.equal(a, b)
    assert (a - b).abs().max() < 1e-5                              # accurate each time, only the bits move


def test_deterministic_declaration_reaches_scope_and_certificate():
    full = Scope(("float32",), True, False, frozenset({"gqa"}))
    assert full.deterministic
    assert parse({"deterministic": False}, source="t", full=full).deterministic is False
    assert parse({}, source="t", full=full).deterministic is True
    with pytest.raises(ScopeError, match="deterministic"):
        parse({"deterministic": "no"}, source="t", full=full)
    a = adapters.load("torch", kernel="tests.kernels.determinism_bugs:random_key_order_declared")[0]
    assert a.deterministic is False and a.scope()["deterministic"] is False
    assert "declared nondeterministic" in scope_sentence(a.scope())
    plain = adapters.load("torch", kernel="tests.kernels.determinism_bugs:random_key_order")[0]
    assert plain.deterministic and "nondeterministic" not in scope_sentence(plain.scope())


SUITE = [("poison_bugs", n, fn.convention, "test_unread_memory", "ATTN-MEM-1") for n, fn in sorted(poison_bugs.BUGS.items())] \
    if importlib.util.find_spec("torch") is not None else []
SUITE += [("determinism_bugs", "random_key_order", None, "test_determinism", "ATTN-DET-1")]
CONTROLS = [("flash", CONTROL[c], c, "test_unread_memory") for c in sorted(CONTROL)] + [
    ("correct", "naive", None, "test_determinism"), ("determinism_bugs", "random_key_order_declared", None,
                                                     "test_determinism")]


@pytest.mark.slow
@pytest.mark.parametrize("module, name, convention, tests, clause", SUITE)
def test_suite_catches_on_its_clause(module, name, convention, tests, clause, tmp_path):
    from bench.runner import run_suite

    extra = ("-k", tests) + ((f"--convention={convention}",) if convention else ())
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.{module}:{name}", stop_at_first=True,
                    extra=extra)
    assert run.returncode == 1 and run.report is not None, f"the suite did not catch {name}:\n{run.output_tail}"
    assert clause in run.first_failure["clauses"] or clause in str(run.first_failure["message"]), run.first_failure
    print(f"{name}: caught by {run.caught_by} on {clause} in {run.wall_s:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("module, name, convention, tests", CONTROLS)
def test_suite_passes_control(module, name, convention, tests, tmp_path):
    from bench.runner import run_suite

    extra = ("-k", tests) + ((f"--convention={convention}",) if convention else ())
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.{module}:{name}", extra=extra)
    # one test of the suite leaves other cells below the floor: INCOMPLETE (exit 2), never a failure
    assert run.report is not None and run.first_failure is None and run.returncode in (0, 2) and \
        run.report["verdict"]["verdict"] != "NONCONFORMANT", f"{name} failed: {run.first_failure}\n{run.output_tail}"
    scope = next(iter(run.report["environment"]["scopes"].values()))
    assert scope.get("deterministic", True) is (name != "random_key_order_declared")
    if name == "random_key_order_declared":
        spreads = [o["value"] for o in run.report.get("observations", []) if o.get("key") == "rerun_spread"]
        assert spreads and max(spreads) > 0, "the declared kernel's spread was not recorded"
