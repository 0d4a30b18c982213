"""The verdict machinery, end to end (SPEC §15-16): divergences exempt only what they name, a
divergence is itself checked, conditions decide where an entry holds, a stale entry never fails an
implementation, an empty or short run is INCOMPLETE, a failure in one dtype leaves the others
judged, and a hanging kernel ends the run in minutes with a complete run file.

The kernels are in tests/kernels/verdicts.py and hostile.py; each run is a real `pytest conformance`
session on the numpy backend with a divergence folder of the test's own: in this interpreter
(bench/runner.py, which tests/test_runner.py checks against separate processes; the runs then share the
emulated baselines of the pinned cases), in a subprocess where the test needs one (a hanging kernel
under --isolate, a hidden package, SIGTERM).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.runner import pytest_in_process

ROOT = Path(__file__).resolve().parent.parent

EMPTY_MEAN = '''
[[divergence]]
id = "TEST-EMPTY-MEAN"
clause = "ATTN-EMPTY-1"
kind = "divergent"
implementations = ["numpy:kernel:*"]
region = "mask_emptied_rows"
instead = "mean_of_values"
quantities = ["out"]
reason = "test entry: rows the mask empties output the mean of V"
witness = "fully_masked_row"
{extra}
'''


def suite(tmp_path: Path, *args: str, entries: str | None = None, timeout: int = 600,
          in_process: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    """The run's exit code and output (stdout and stderr together when in process) and its run file."""
    report = tmp_path / "run.json"
    folder = tmp_path / "divergences"
    folder.mkdir(exist_ok=True)
    if entries is not None:
        (folder / "numpy.toml").write_text(entries)
    argv = ["conformance", "--backend=numpy", "--hypothesis-profile=ci", "-q", "-p", "no:cacheprovider",
            f"--divergences-dir={folder}", f"--report={report}", *args]
    if in_process:
        returncode, output = pytest_in_process(argv, timeout)
        proc = subprocess.CompletedProcess(argv, returncode, output, "")
    else:
        proc = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


# A run expected to fail needs only the properties that see the bug: the whole suite would shrink a
# failure in every cell (110 s for the tripled-logits kernel, measured) to show the same verdict.
AGREEMENT = ("-k", "test_output_matches_reference")


def test_a_bug_behind_a_declared_divergence_is_caught(tmp_path):
    """The kernel's empty rows are declared (mean of V); its other rows, wrong in exactly the cases that
    have an empty row, are still judged: NONCONFORMANT. A whole-case exemption passed it.
    The cases saved beside the run file are this run's: one left by an earlier run is removed."""
    saved = tmp_path / "run-failures"
    saved.mkdir()
    (saved / "left-by-an-earlier-run.npz").write_bytes(b"")
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:MeanOfValuesTripledLogits", *AGREEMENT,
                      entries=EMPTY_MEAN.format(extra=""))
    assert run["verdict"]["verdict"] == "NONCONFORMANT", proc.stdout[-2000:]
    assert proc.returncode == 1
    failing = [c for c in run["cells"] if c["status"] == "failing"]
    assert failing and all(c["first_failure"]["case"] for c in failing)
    assert "mask=" in " ".join(c["first_failure"]["case"] for c in failing)   # the failing cases have masks
    named = {Path(r["failure_file"]).name for r in run["records"] if r["failure_file"]}
    assert named and {p.name for p in saved.glob("*.npz")} == named
    # replaying one of them into the same run file keeps the saved cases
    rec = next(r for r in run["records"] if r["failure_file"])
    suite(tmp_path, "-k", rec["test"], "--kernel=tests.kernels.verdicts:MeanOfValuesTripledLogits",
          f"--replay={rec['failure_file']}", entries=EMPTY_MEAN.format(extra=""))
    assert {p.name for p in saved.glob("*.npz")} == named


def test_the_same_kernel_without_the_bug_conforms_with_its_divergence(tmp_path):
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:MeanOfValues", entries=EMPTY_MEAN.format(extra=""))
    v = run["verdict"]
    assert v["verdict"] == "CONFORMANT_WITH_DIVERGENCES", proc.stdout[-3000:]
    assert v["divergences"] == ["TEST-EMPTY-MEAN"] and proc.returncode == 0
    divergent = {(c["clause"], c["dtype"]) for c in run["cells"] if c["status"] == "divergent"}
    assert divergent and {c for c, _ in divergent} == {"ATTN-EMPTY-1"}, divergent   # only where it applies
    assert sum(c["checked"] for c in run["cells"] if c["status"] == "conformant") > 500   # everything else judged
    entry = run["divergences"][0]
    assert entry["holds"] and entry["witness_status"] == "diverges as declared", entry


def test_a_divergence_is_checked_against_what_it_declares(tmp_path):
    """The same kernel with an entry that declares NaN rows instead of the mean: the rows do not do
    what the entry says, so the run fails on the entry's clause."""
    wrong = EMPTY_MEAN.format(extra="").replace('instead = "mean_of_values"', 'instead = "nan"')
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:MeanOfValues", *AGREEMENT, entries=wrong)
    assert run["verdict"]["verdict"] == "NONCONFORMANT"
    assert "ATTN-EMPTY-1" in run["verdict"]["failed_clauses"], run["verdict"]
    assert "does not behave as declared" in proc.stdout


def test_an_entry_whose_conditions_exclude_this_machine_is_inactive(tmp_path):
    """An entry that holds only on a CPU without SSE2 (none that runs this suite) does not apply: the
    kernel's empty rows are judged by the spec and fail; the entry is reported inactive, not stale."""
    entries = EMPTY_MEAN.format(extra='when = { cpu = "not sse2" }')
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:MeanOfValues", "-k",
                      "test_output_matches_reference or test_fully_masked_rows_are_zero", entries=entries)
    entry = run["divergences"][0]
    assert entry["holds"] is False and "sse2" in entry["condition"], entry
    assert run["verdict"]["verdict"] == "NONCONFORMANT" and "ATTN-EMPTY-1" in run["verdict"]["failed_clauses"]
    assert "inactive here" in proc.stdout


def test_stale_and_inactive_entries_leave_a_correct_kernel_conformant(tmp_path):
    """Two entries declared for a correct implementation (one whole ci run serves both): one whose
    condition excludes this machine (numpy < 1) is inactive, neither applied nor stale; the other applies
    and its witness conforms, so it is stale. The verdict stays CONFORMANT, the stale entry is listed in
    the run file and the terminal, and entries_check refuses it."""
    inactive = (EMPTY_MEAN.format(extra='when = { packages = { numpy = "<1" } }')
                .replace("TEST-EMPTY-MEAN", "TEST-EMPTY-MEAN-INACTIVE"))
    entries = (EMPTY_MEAN.format(extra="") + inactive).replace("numpy:kernel:*", "numpy:reference")
    proc, run = suite(tmp_path, "--impl=numpy:reference", entries=entries)
    assert run["verdict"]["verdict"] == "CONFORMANT", proc.stdout[-2000:]
    by_id = {d["id"]: d for d in run["divergences"]}
    assert by_id["TEST-EMPTY-MEAN-INACTIVE"]["holds"] is False and "numpy" in by_id["TEST-EMPTY-MEAN-INACTIVE"]["condition"]
    assert run["verdict"]["stale"] == ["TEST-EMPTY-MEAN"] and proc.returncode == 0
    assert "STALE divergence TEST-EMPTY-MEAN:" in proc.stdout and "STALE divergence TEST-EMPTY-MEAN-INACTIVE" not in proc.stdout
    check = subprocess.run([sys.executable, "-m", "attnconf.conformance.engine.entries_check", str(tmp_path / "run.json")],
                           cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 1 and "TEST-EMPTY-MEAN" in check.stdout + check.stderr


def test_an_empty_selection_is_incomplete(tmp_path):
    proc, run = suite(tmp_path, "-k", "nothing_matches_this", entries="")
    assert run["verdict"]["verdict"] == "INCOMPLETE" and proc.returncode != 0
    assert run["records"] == []


def test_a_machine_without_jsonschema_still_gets_its_run_file(tmp_path):
    """jsonschema only checks the run file; where it is missing (the lent GPU image lacked it) the run
    file is written unvalidated, with one line saying so. The run used to end in a traceback, no file."""
    hide = tmp_path / "hide" / "jsonschema"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    report = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", "--backend=numpy", "--hypothesis-profile=ci",
                           "-q", "-p", "no:cacheprovider", "-k", "test_output_shape_and_dtype", f"--report={report}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(report.read_text())
    assert run["records"] and run["verdict"]["verdict"] == "INCOMPLETE"
    assert proc.stderr.count("jsonschema is not installed") == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_partial_selection_is_incomplete_and_names_the_missing_cells(tmp_path):
    proc, run = suite(tmp_path, "-k", "test_output_matches_reference", entries="")
    v = run["verdict"]
    assert v["verdict"] == "INCOMPLETE" and proc.returncode != 0
    assert any(m["clause"] == "ATTN-CAUSAL-2" and m["status"] == "not_run" for m in v["missing"]), v["missing"][:5]
    assert "cells missing the floor" in proc.stdout


def test_a_failure_in_one_dtype_leaves_the_others_judged(tmp_path):
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:HalfOnlyWrong", "-k",
                      "test_output_matches_reference or test_effective_scale_is_declared", entries="")
    assert run["verdict"]["verdict"] == "NONCONFORMANT"
    cells = [c for c in run["cells"] if c["clause"] == "ATTN-OP-4"]
    by_dtype = {c["dtype"]: c["status"] for c in cells}
    assert by_dtype["float16"] == "failing", by_dtype
    assert {by_dtype[d] for d in ("float64", "float32", "bfloat16")} == {"conformant"}, by_dtype


MQA_RAISES = '''
[[divergence]]
id = "TEST-MQA-RAISES"
clause = "ATTN-GQA-2"
kind = "bug"
implementations = ["numpy:kernel:*"]
region = "multi_query"
instead = "raises"
reason = "test entry: one KV head for several query heads raises"
witness = "multi_query_heads"
'''


def test_a_cell_whose_every_case_raises_as_declared_ends_early(tmp_path):
    """Every case of test_mqa_single_kv_head is MQA, and the kernel raises on each as its entry declares:
    each cell stops after RAISES_DRAWS draws (Hypothesis would draw hundreds), divergent, every raise
    checked. The GQA test beside it, whose cases are mostly not MQA, still judges its examples."""
    from attnconf.conformance.engine.harness import RAISES_DRAWS

    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:RaisesOnMultiQuery", "-k",
                      "test_mqa_single_kv_head or test_gqa_is_repeat_interleave", entries=MQA_RAISES)
    mqa = [r for r in run["records"] if r["test"] == "test_mqa_single_kv_head"]
    assert len(mqa) == 4, [r["dtype"] for r in mqa]
    for r in mqa:
        assert r["examples_checked"] == 0 and r["examples_divergent"] == r["examples"] <= RAISES_DRAWS + 1, r
        assert "raised as declared (TEST-MQA-RAISES)" in r["message"], r["message"]
    gqa = [c for c in run["cells"] if c["clause"] == "ATTN-GQA-1"]
    assert gqa and all(c["checked"] >= 3 for c in gqa), gqa
    assert {c["status"] for c in run["cells"] if c["clause"] == "ATTN-GQA-2"} == {"divergent"}


def test_failed_clauses_are_the_clauses_that_failed(tmp_path):
    proc, run = suite(tmp_path, "--kernel=tests.kernels.verdicts:WrongOutputDtype", "-k",
                      "test_agreement or test_output_shape_and_dtype or test_masks", entries="")
    v = run["verdict"]
    assert v["verdict"] == "NONCONFORMANT" and v["failed_clauses"] == ["ATTN-OP-5"], v["failed_clauses"]
    assert v["failures"][0]["replay"]
    op5 = {c["dtype"]: c["status"] for c in run["cells"] if c["clause"] == "ATTN-OP-5"}
    assert op5["float16"] == op5["bfloat16"] == "failing" and op5["float32"] == op5["float64"] == "conformant", op5


@pytest.mark.slow
def test_a_hanging_kernel_ends_within_minutes_with_a_complete_run_file(tmp_path):
    """A kernel that never returns once Lq > 3, the whole suite under --isolate: after two timed-out calls it
    is not called again, so the run ends in minutes and its file is complete. The calls time out after 5 s,
    not the default 60 s: the two timeouts are the only waits, so with the defaults the same run takes
    2 x 55 s longer (which the bound below adds); the rest of the run is what is measured."""
    from attnconf.conformance.engine.harness import Session

    timeout = 5.0
    started = time.time()
    proc, run = suite(tmp_path, "--kernel=tests.kernels.hostile:hang_if_long_queries", "--isolate",
                      f"--case-timeout={timeout:g}", entries="", timeout=330, in_process=False)
    took = time.time() - started
    with_defaults = took + Session.max_timeouts * (Session.case_timeout - timeout)
    assert with_defaults < 300, f"took {took:.0f} s, {with_defaults:.0f} s with the default case timeout"
    assert run["environment"]["case_timeout_s"] == timeout, run["environment"]
    assert run["complete"] and run["verdict"]["verdict"] == "NONCONFORMANT"
    statuses = {r["status"] for r in run["records"]}
    assert "timeout" in statuses and len(run["records"]) > 100, statuses
    assert any("not called" in (r["message"] or "") for r in run["records"])


def test_a_stopped_run_keeps_its_records(tmp_path):
    """SIGTERM in the middle of a run: the run file holds the records so far and says INCOMPLETE."""
    report = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "conformance", "--backend=numpy", "-q", "-p",
                             "no:cacheprovider", "--hypothesis-profile=ci", f"--report={report}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (report.exists() and json.loads(report.read_text())["records"]):
        time.sleep(0.5)
    proc.terminate()
    proc.communicate(timeout=120)
    run = json.loads(report.read_text())
    assert run["records"] and run["verdict"]["verdict"] == "INCOMPLETE" and run["complete"] is False


def test_each_cell_has_its_own_hypothesis_database_key():
    """One key per property x implementation x dtype: replaying a failure re-runs that cell's own
    failing example and nothing else (a shared key replayed one test's failures into another)."""
    from hypothesis.internal.reflection import function_digest

    from attnconf.conformance.engine import harness
    from attnconf.conformance.test_agreement import test_lse_matches_reference, test_output_matches_reference

    class Fake:
        def __init__(self, name):
            self.name = name

    bodies = [harness.cell_body(fn, Fake(impl), dtype)
              for fn in (test_output_matches_reference, test_lse_matches_reference)
              for impl in ("a:x", "a:y") for dtype in ("float32", "float16")]
    assert len({function_digest(b) for b in bodies}) == len(bodies) == 8


def test_a_failure_names_one_clause_in_its_record_and_its_message():
    """judge(..., clause) names the test's clause, in the exception and in the message alike, except for the
    tags more specific than any test's clause (a non-finite value, the lse of a row that sees no key): a
    flash-convention kernel whose empty-row lse was finite was reported as ATTN-LSE-1 in the run file and
    [ATTN-EMPTY-2] in the message (red team, 2026-11-25)."""
    from attnconf.conformance.engine.harness import ConformanceFailure, judge
    from attnconf.conformance.engine.tolerance import Judgement
    from attnconf.reference import Case

    case = Case.build(*(np.ones((1, 1, 2, 4)) for _ in range(3)), dtype="float32")

    def failure(reason: str, clause: str | None) -> ConformanceFailure:
        j = Judgement(False, "lse", "float32", 1.0, 1.0, 0, 0, 0, 0, 0, 1.0, 1.0, reason)
        with pytest.raises(ConformanceFailure) as info:
            judge(j, case, "k", clause)
        return info.value

    for reason, clause, named in [("[ATTN-EMPTY-2] lse of fully-masked row (0, 0, 1) is -3.0, not -inf", "ATTN-LSE-1",
                                   "ATTN-EMPTY-2"),
                                  ("[ATTN-TOL-3] lse: 1 non-finite value(s)", "ATTN-SINK-2", "ATTN-TOL-3"),
                                  ("[ATTN-TOL-1] lse: max error 1 vs allowed 0", "ATTN-ALIBI-2", "ATTN-ALIBI-2"),
                                  ("[ATTN-TOL-1] lse: max error 1 vs allowed 0", None, "ATTN-TOL-1"),
                                  ("lse: max error 1 vs allowed 0", "ATTN-DECODE-1", "ATTN-DECODE-1")]:
        exc = failure(reason, clause)
        assert exc.clause == named, (reason, clause, exc.clause)
        assert str(exc).startswith(f"k: [{named}] "), str(exc)
        assert str(exc).count("[ATTN-") == 1, str(exc)
