"""What a run no longer spends before its first failure: a second import of every test module (for the
verdict's plan), a pretty-printed array dump of every pinned case, and a partial run file written just
before the final one. Each test shows the saving keeps what the run says."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from hypothesis.vendor.pretty import pretty

from attnconf.conformance.engine import plugin, run_file
from attnconf.reference import Case

ROOT = Path(__file__).resolve().parent.parent


def test_the_plan_reads_the_test_modules_pytest_imported():
    """In a checkout pytest imports the suite as `conformance.test_*`; the plan reads those modules instead of
    importing each file again as `attnconf.conformance.test_*`, and lists the same tests either way."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import conformance\n"
        "from attnconf.conformance.engine.verdict import plan\n"
        "names = [m.name for m in pkgutil.iter_modules(conformance.__path__) if m.name.startswith('test_')]\n"
        "for n in names: importlib.import_module('conformance.' + n)\n"
        "reused = sorted(p.test for p in plan())\n"
        "again = [m for m in sys.modules if m.startswith('attnconf.conformance.test_')]\n"
        "for n in names: sys.modules.pop('conformance.' + n)\n"
        "fresh = sorted(p.test for p in plan())\n"
        "print(json.dumps({'again': again, 'same': reused == fresh, 'tests': len(reused)}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["again"] == [] and got["same"] and got["tests"] > 50, out.stderr[-2000:]


def test_hypothesis_prints_a_case_as_its_summary():
    case = Case.build(*(np.ones((1, 2, 3, 4)) for _ in range(3)), dtype="float32", causal="top_left")
    assert pretty(case) == f"Case({case.summary()})"
    assert "array" not in pretty(case)


def test_the_failure_that_stops_the_run_leaves_the_write_to_the_end(monkeypatch):
    """Under -x (or --maxfail=N) the failure that stops the run is not written as a partial run file: the
    final one follows at once. Every other record is, as before."""
    writes = []
    monkeypatch.setattr(run_file, "write_partial", lambda state: writes.append(1))
    for maxfail, expected in ((1, [0, 0]), (2, [1, 0]), (0, [1, 1])):
        writes.clear()
        state = plugin.RunState.__new__(plugin.RunState)
        state.records, state.failed = [], 0
        state.config = SimpleNamespace(option=SimpleNamespace(maxfail=maxfail))
        got = []
        for failed in (True, True):
            before = len(writes)
            state.pytest_runtest_logreport(SimpleNamespace(user_properties=[("attnconf", {})], failed=failed))
            got.append(len(writes) - before)
        assert got == expected, (maxfail, got)
