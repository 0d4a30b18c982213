"""The kernel author's contract end to end (slow: the real suite on tests/kernels/declared.py):
correct kernels with documented behaviour or limits are certified from their declarations alone,
and a real bug beside a documented behaviour or limit is still caught."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the kernels are written in torch")]

KERNELS = "tests.kernels.declared"


def _run(name: str, tmp_path, **kw):
    from bench.runner import run_suite

    run = run_suite("torch", tmp_path / "run.json", kernel=f"{KERNELS}:{name}", **kw)
    assert run.report is not None, run.output_tail
    return run


def test_documented_nan_rows_are_certified_by_the_declaration(tmp_path):
    run = _run("empty_rows_nan", tmp_path)
    v = run.report["verdict"]
    assert run.returncode == 0 and v["verdict"] == "CONFORMANT_WITH_DIVERGENCES", run.output_tail
    assert set(v["divergences"]) == {"DECLARED-EMPTY-ROWS", "DECLARED-EMPTY-ROWS-GRADS"}
    declared = {d["id"]: d for d in run.report["divergences"] if d.get("declared")}
    assert all(d["examples"] > 0 and not d["contradicted"] for d in declared.values()), declared
    assert 'declared empty_rows = "nan" (DECLARED-EMPTY-ROWS, ATTN-EMPTY-1): checked on' in run.output_tail


def test_a_real_bug_beside_the_documented_behaviour_is_caught(tmp_path):
    run = _run("empty_rows_nan_scale_bug", tmp_path, stop_at_first=True)
    assert run.returncode == 1 and run.report["verdict"]["verdict"] == "NONCONFORMANT", run.output_tail
    assert "scale=0" in (run.first_failure or {}).get("case", ""), run.first_failure


def test_declared_limits_certify_a_narrow_kernel(tmp_path):
    """Lq and Lk multiples of 16, causal only with Lq == Lk, ValueError elsewhere: CONFORMANT, with the
    fixed-case cells (mask polarity, padding, mask combination) fitted into the limits, not left out."""
    run = _run("multiple_of_16", tmp_path)
    assert run.returncode == 0 and run.report["verdict"]["verdict"] == "CONFORMANT", run.first_failure
    cells = {(c["clause"], c["dtype"]): c["status"] for c in run.report["cells"]}
    for clause in ("ATTN-MASK-1", "ATTN-MASK-4", "ATTN-MASK-6", "ATTN-OP-3", "ATTN-CAUSAL-1"):
        assert "conformant" in {s for (c, _), s in cells.items() if c == clause}, clause


def test_the_bug_inside_a_narrow_limit_is_drawn(tmp_path):
    """The issue's kernel: non-causal only with Lq a multiple of 128, and zero-padded keys attended when Lk
    is not a multiple of its block. Generation fits Lq to 128 and leaves Lk free, so the bug is drawn."""
    run = _run("noncausal_q128_padded_keys_bug", tmp_path, stop_at_first=True)
    assert run.returncode == 1 and run.report["verdict"]["verdict"] == "NONCONFORMANT", run.output_tail
    case = (run.first_failure or {}).get("case", "")
    assert "Lq=128" in case or "Lq=256" in case or "Lq=384" in case, run.first_failure


def test_a_refused_kvcache_representation_is_not_blamed_on_a_feature(tmp_path):
    """A correct flash_attn_with_kvcache that does not take cache_batch_idx passes ATTN-SCOPE-1 (its custom_scale
    probe used to draw cache_batch_idx and fail, blaming custom_scale). Only the scope tests run: seconds."""
    run = _run("kvcache_without_batch_idx", tmp_path,
               extra=("--convention=flash_attn_kvcache", "-k", "test_declared_features_run or test_declared_dtypes"))
    assert run.report["verdict"]["failed_clauses"] == [], run.output_tail
