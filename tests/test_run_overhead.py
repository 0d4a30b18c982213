"""What keeps the suite's own overhead small stays harmless: the validator with its `$defs` written in
place judges exactly as the published schema does, partial run-file writes spend a bounded share of the
run, and the run's lighter garbage collection is undone when pytest ends."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from attnconf.conformance.engine import plugin, run_file
from attnconf.reports import runfile
from tests.test_reports_fixtures import FIXTURES, GOOD

ROOT = Path(__file__).resolve().parent.parent


def _registry_errors(data):
    schema = runfile.schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted((list(e.absolute_path), e.message) for e in validator.iter_errors(data))


def _inlined_errors(data):
    return sorted((list(e.absolute_path), e.message) for e in runfile._validator().iter_errors(data))


def _corruptions(run):
    yield run
    for path, value in [(("records", 0, "examples"), -1), (("records", 0, "status"), "weird"),
                        (("records", 0, "clauses"), ["nope"]), (("environment", "device"), 3),
                        (("verdict", "verdict"), "FINE"), (("records", 0, "ratios"), {"float32": {"max": "x"}})]:
        bad = copy.deepcopy(run)
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        yield bad


@pytest.mark.parametrize("name", GOOD)
def test_inlined_schema_judges_as_the_published_one(name):
    run = runfile.encode(json.loads((FIXTURES / name).read_text()))
    for data in _corruptions(run):
        assert _inlined_errors(data) == _registry_errors(data)
    assert len(_inlined_errors(list(_corruptions(run))[1])) >= 1


def test_a_reference_outside_the_defs_is_refused():
    with pytest.raises(runfile.RunFileError, match="unsupported reference"):
        runfile._inline_refs({"$ref": "https://example.com/other.json"}, {})


def test_partial_writes_are_spaced_by_their_cost(tmp_path, monkeypatch):
    """Every WRITE_EVERY_S at most, and never more than 1/WRITE_COST_SHARE of the time."""
    writes = []
    monkeypatch.setattr(run_file, "build", lambda state, final: {})
    monkeypatch.setattr(run_file, "write", lambda state, path, run: writes.append(time.time()))
    config = SimpleNamespace(getoption=lambda name: str(tmp_path / "run.json"))
    state = SimpleNamespace(run=None, last_write=0.0, write_cost=0.0, config=config)
    run_file.write_partial(state)
    assert len(writes) == 1                                   # the first record is written at once
    run_file.write_partial(state)
    assert len(writes) == 1                                   # then not before WRITE_EVERY_S
    state.last_write = time.time() - run_file.WRITE_EVERY_S - 1
    state.write_cost = 1.0                                     # a write that took 1 s waits 50 s
    run_file.write_partial(state)
    assert len(writes) == 1
    state.last_write = time.time() - run_file.WRITE_COST_SHARE * 1.0 - 1
    run_file.write_partial(state)
    assert len(writes) == 2
    run_file.write_partial(state, force=True)                  # SIGTERM and the end always write
    assert len(writes) == 3


def test_garbage_collection_is_restored_after_the_run(tmp_path):
    """During the run: objects alive after collection frozen, full collections every GC_FULL_AFTER;
    after it, the process's own settings again."""
    code = (
        "import gc, json, sys, pytest\n"
        "gc.set_threshold(555, 7, 9)\n"
        "seen = {}\n"
        "class Probe:\n"
        "    def pytest_runtest_call(self, item):\n"
        "        seen.setdefault('during', [list(gc.get_threshold()), gc.get_freeze_count() > 0])\n"
        "rc = pytest.main(['conformance', '--backend=numpy', '-q', '-p', 'no:cacheprovider',\n"
        "                  '-k', 'test_output_shape_and_dtype and float32'], plugins=[Probe()])\n"
        "print(json.dumps({'during': seen.get('during'), 'after': [list(gc.get_threshold()),\n"
        "                  gc.get_freeze_count()]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["during"] == [[555, 7, plugin.GC_FULL_AFTER], True], out.stdout[-2000:]
    assert got["after"] == [[555, 7, 9], 0]
    # a process that froze objects itself keeps them frozen
    out = subprocess.run([sys.executable, "-c", code.replace("gc.set_threshold(555, 7, 9)\n",
                                                              "gc.set_threshold(555, 7, 9)\ngc.freeze()\n")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"][0] == [555, 7, 9] and got["after"][1] > 0, out.stdout[-2000:]
