"""A run split over processes by pytest-xdist (`-n 2`) gives the same records, cells and verdict as one
process: the workers send their records to the controller, which alone writes the run file.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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
    cells = [{(c["implementation"], c["clause"], c["dtype"]): (c["status"], c["checked"]) for c in run["cells"]}
             for run in (one, two)]
    assert cells[0] == cells[1]
    assert one["verdict"]["verdict"] == two["verdict"]["verdict"] == "INCOMPLETE"   # a partial selection
    assert one["verdict"]["missing"] == two["verdict"]["missing"]
