"""Run the conformance suite, in this process or in a subprocess, and summarise its run JSON.

Shared by the catalogue tests (tests/test_catalogue*.py: does the suite catch each planted bug?) and
the benchmarks in bench/ (how long does a run take, how soon is a bug caught?).

By default a run is a fresh pytest session in this interpreter (`pytest.main`): the catalogue's
hundred-odd runs then import Python, torch and the suite once per process instead of once per kernel.
Each run still gets its own pytest config, plugin session, run file and Hypothesis profile (restored
afterwards), so its verdict is the one a separate `pytest conformance` process gives
(tests/test_runner.py compares the two on a sample of kernels). `in_process=False`, or the
environment variable ATTNCONF_SUITE_SUBPROCESS=1, runs it in a subprocess instead: that keeps one
framework per process (several backends in one script) and makes the run's wall and CPU time the
whole process's (interpreter start, framework import and collection included), as the time-to-first-
failure benchmark needs.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SuiteRun:
    """One `pytest conformance` subprocess: exit code, wall time, and what the run JSON says."""

    args: list[str]
    returncode: int
    wall_s: float
    report: dict[str, Any] | None
    output: str
    first_failure: dict[str, Any] | None = field(default=None)

    @property
    def output_tail(self) -> str:
        return self.output[-3000:]

    def durations(self) -> list[tuple[float, str, str]]:
        """(seconds, phase, node id) from pytest's --durations section, slowest first."""
        rows: list[tuple[float, str, str]] = []
        lines = iter(self.output.splitlines())
        for line in lines:
            if "slowest" in line and "durations" in line:
                break
        for line in lines:
            if line.startswith("="):
                break
            parts = line.split(maxsplit=2)
            if len(parts) == 3 and parts[0].endswith("s"):
                try:
                    rows.append((float(parts[0][:-1]), parts[1], parts[2]))
                except ValueError:
                    pass
        return rows

    @property
    def caught_by(self) -> str | None:
        f = self.first_failure
        return None if f is None else f.get("nodeid") or f.get("test")


def run_suite(backend: str, report: Path, *, kernel: str | None = None, profile: str = "ci",
              stop_at_first: bool = False, extra: tuple[str, ...] = (), timeout_s: float = 900,
              in_process: bool | None = None) -> SuiteRun:
    """Run `pytest conformance --backend=...` from the repository root: in this interpreter unless
    `in_process` is False (None: in this interpreter unless ATTNCONF_SUITE_SUBPROCESS=1)."""
    report = Path(report)
    report.unlink(missing_ok=True)
    args = ["conformance", f"--backend={backend}", "-q", "-p", "no:randomly",
            f"--hypothesis-profile={profile}", f"--report={report}", "-W", "ignore::UserWarning"]
    if kernel:
        args.append(f"--kernel={kernel}")
    if stop_at_first:
        args.append("-x")
    args.extend(extra)
    if in_process is None:
        in_process = os.environ.get("ATTNCONF_SUITE_SUBPROCESS", "") in ("", "0")
    t0 = time.perf_counter()
    if in_process:
        returncode, output = pytest_in_process(args, timeout_s)
    else:
        proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    wall = time.perf_counter() - t0
    data = json.loads(report.read_text()) if report.exists() else None
    run = SuiteRun(["-m", "pytest", *args], returncode, wall, data, output)
    run.first_failure = first_failure(data)
    return run


def pytest_in_process(args: list[str], timeout_s: float) -> tuple[int, str]:
    """`pytest.main(args)` from the repository root as a separate run would see it: (exit code, output).

    What a session changes in the interpreter is put back afterwards: the working directory, the
    active Hypothesis profile, the SIGTERM handler the plugin installs, sys.path, and the test modules
    of conformance/ (re-imported by the next run, so no module-level state carries over; the
    frameworks and the suite's own modules stay imported, which is the point). `timeout_s` becomes
    the run's --run-timeout (no test starts after it) unless `args` name one."""
    import pytest
    from hypothesis import settings

    if not any(a.startswith("--run-timeout") for a in args):
        args = [*args, f"--run-timeout={timeout_s:g}"]
    profile = settings.get_current_profile_name()
    sigterm = signal.getsignal(signal.SIGTERM) if _main_thread() else None
    path, cwd = list(sys.path), os.getcwd()
    before = set(sys.modules)
    out = io.StringIO()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            returncode = int(pytest.main(args))
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        settings.load_profile(profile)
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
        for name in [m for m in sys.modules if m not in before and _is_test_module(m)]:
            del sys.modules[name]
    return returncode, out.getvalue()


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _is_test_module(name: str) -> bool:
    """A module pytest imported as a test file or conftest (not the suite's engine, which stays)."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def first_failure(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first record that failed (or errored), in run order, trimmed to what a table needs."""
    for rec in (data or {}).get("records", []):
        if rec.get("status") in ("fail", "error"):
            return {k: rec.get(k) for k in ("nodeid", "test", "status", "examples", "duration_s", "clauses",
                                            "failed_clause", "message", "case")}
    return None
