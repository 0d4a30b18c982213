"""bench/runner.py's in-process runs give the verdicts separate `pytest conformance` processes give.

The catalogue tests run each kernel's suite as a fresh pytest session inside their own interpreter
(torch is imported once per process, not once per kernel). That is only sound if nothing of one run
leaks into the next: these tests run a sample of catalogue kernels both ways (in process after
other in-process runs, and in a subprocess) and compare what the catalogue tests read: exit code,
verdict, the test that failed first, its clause and its number of examples.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from hypothesis import settings

from bench.runner import run_suite

HAS_TORCH = importlib.util.find_spec("torch") is not None
# (backend, kernel, convention): one kernel of each catalogue, caught in the pinned cases and after
# Hypothesis' generated examples, and a correct control's whole -x run on the numpy backend
SAMPLE = [
    ("torch", "tests.kernels.buggy:no_scale", None),
    ("torch", "tests.kernels.buggy:low_precision_accumulation", None),
    ("torch", "tests.kernels.flash_buggy:alibi_sign", "flash_attn"),
    ("numpy", "tests.kernels.variant_bugs:sink_scaled", None),
    ("numpy", "tests.kernels.variant_bugs:window_ignores_padding", None),
]


def _summary(run) -> dict:
    f = run.first_failure or {}
    return {"returncode": run.returncode, "verdict": (run.report or {}).get("verdict", {}).get("verdict"),
            "caught_by": run.caught_by, "clauses": f.get("clauses"), "failed_clause": f.get("failed_clause"),
            "examples": f.get("examples"), "status": f.get("status"),
            "records": len((run.report or {}).get("records", []))}


@pytest.mark.slow
@pytest.mark.parametrize("backend, kernel, convention", SAMPLE, ids=[k.split(":")[1] for _, k, _ in SAMPLE])
def test_in_process_run_gives_the_subprocess_verdict(backend, kernel, convention, tmp_path):
    if backend == "torch" and not HAS_TORCH:
        pytest.skip("torch is not installed")
    extra = (f"--convention={convention}",) if convention else ()
    inside = run_suite(backend, tmp_path / "in.json", kernel=kernel, stop_at_first=True, extra=extra, in_process=True)
    outside = run_suite(backend, tmp_path / "out.json", kernel=kernel, stop_at_first=True, extra=extra,
                        in_process=False)
    assert inside.report is not None, inside.output_tail
    assert _summary(inside) == _summary(outside), inside.output_tail
    assert inside.returncode == 1 and inside.caught_by, inside.output_tail


def test_an_in_process_run_leaves_the_interpreter_as_it_found_it(tmp_path):
    """The working directory, the Hypothesis profile and sys.path are put back; the suite's test modules are
    dropped (the next run imports them afresh); the run's output and run file are the run's own."""
    cwd, path, profile = os.getcwd(), list(sys.path), settings.get_current_profile_name()
    suite_modules = (".conformance.test_", ".attnconf.conformance.test_")
    had = {m for m in sys.modules if f".{m}".startswith(suite_modules)}   # imported by other tests of this worker
    os.chdir(tmp_path)
    try:
        run = run_suite("numpy", tmp_path / "run.json", extra=("-k", "test_output_shape_and_dtype"),
                        in_process=True)
        assert os.getcwd() == str(tmp_path)
    finally:
        os.chdir(cwd)
    assert sys.path == path and settings.get_current_profile_name() == profile
    assert {m for m in sys.modules if f".{m}".startswith(suite_modules)} == had
    assert run.report is not None and run.report["records"], run.output_tail
    assert run.report["verdict"]["verdict"] == "INCOMPLETE" and run.returncode != 0
    assert "passed" in run.output and run.args[:2] == ["-m", "pytest"]
