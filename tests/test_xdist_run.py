"""A run split over processes by pytest-xdist (`-n 2`) gives the same records, cells and verdict as one
process: the workers send their records to the controller, which alone writes the run file.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
SUBSET = ["conformance/test_masks.py", "conformance/test_agreement.py", "conformance/test_first_look.py"]


def _run(tmp_path: Path, *extra: str) -> dict:
    report = tmp_path / f"run{len(extra)}.json"
    subprocess.run([sys.executable, "-m", "pytest", *SUBSET, "--backend=numpy", "--hypothesis-profile=ci", "-q",
                    "-p", "no:cacheprovider", f"--report={report}", *extra],
                   cwd=ROOT, capture_output=True, text=True, timeout=600)
    return json.loads(report.read_text())


def test_two_workers_give_the_records_and_verdict_of_one_process(tmp_path):
    one, two = _run(tmp_path), _run(tmp_path, "-n", "2")
    records = [{r["nodeid"]: (r["status"], r["examples_checked"]) for r in run["records"]} for run in (one, two)]
    assert records[0] and records[0] == records[1]
    # the cells' statuses agree; their credited counts (examples that exercise each clause's subject) may not:
    # measured on this subset, 2 of 33 records drew other feature mixes in the same number of examples under
    # -n 2, so a few float32 cells credit 1 to 3 examples fewer or more (an open item of the honest certificate)
    cells = [{(c["implementation"], c["clause"], c["dtype"]): c["status"] for c in run["cells"]} for run in (one, two)]
    assert cells[0] == cells[1]
    assert one["verdict"]["verdict"] == two["verdict"]["verdict"] == "INCOMPLETE"   # a partial selection
    assert one["verdict"]["missing"] == two["verdict"]["missing"]


def test_a_stopped_run_over_two_workers_keeps_its_records(tmp_path):
    """SIGTERM to the controller of `-n 2`: the run file holds the records its workers had sent, says
    INCOMPLETE, and no worker is left running."""
    report = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "conformance", "--backend=numpy", "-q", "-n", "2",
                             "-p", "no:cacheprovider", "--hypothesis-profile=ci", f"--report={report}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (report.exists() and json.loads(report.read_text())["records"]):
        time.sleep(0.5)
    proc.terminate()
    out, _ = proc.communicate(timeout=120)
    run = json.loads(report.read_text())
    assert run["records"] and run["verdict"]["verdict"] == "INCOMPLETE" and run["complete"] is False, out[-2000:]
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not left, f"worker processes still running: {left}"


def test_run_timeout_bounds_a_run_over_two_workers(tmp_path):
    """--run-timeout holds in every worker: the run ends with the cells it reached and the rest not run."""
    report = tmp_path / "run.json"
    subprocess.run([sys.executable, "-m", "pytest", "conformance", "--backend=numpy", "--hypothesis-profile=ci", "-q",
                    "-n", "2", "-p", "no:cacheprovider", "--run-timeout=4", f"--report={report}"],
                   cwd=ROOT, capture_output=True, text=True, timeout=300)
    run = json.loads(report.read_text())
    statuses = {r["status"] for r in run["records"]}
    assert "pass" in statuses and "not_run" in statuses, statuses
    assert run["verdict"]["verdict"] == "INCOMPLETE" and run["complete"] is False
