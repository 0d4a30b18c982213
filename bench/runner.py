"""Run the conformance suite in a subprocess and summarise its run JSON.

Shared by tests/test_catalogue.py (does the suite catch each planted bug?) and
bench/bench_suite.py (how long does a run take, how soon is a bug caught?).
A subprocess per run keeps one framework per process and makes each run's
wall time honest (interpreter start, framework import and collection included).
"""
from __future__ import annotations

import json
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
              stop_at_first: bool = False, extra: tuple[str, ...] = (), timeout_s: float = 900) -> SuiteRun:
    """Run `python -m pytest conformance --backend=...` from the repository root."""
    report = Path(report)
    report.unlink(missing_ok=True)
    args = [sys.executable, "-m", "pytest", "conformance", f"--backend={backend}", "-q", "-p", "no:randomly",
            f"--hypothesis-profile={profile}", f"--report={report}", "-W", "ignore::UserWarning"]
    if kernel:
        args.append(f"--kernel={kernel}")
    if stop_at_first:
        args.append("-x")
    args.extend(extra)
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    data = json.loads(report.read_text()) if report.exists() else None
    run = SuiteRun(args[1:], proc.returncode, wall, data, proc.stdout + proc.stderr)
    run.first_failure = first_failure(data)
    return run


def first_failure(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first record that failed (or errored), in run order, trimmed to what a table needs."""
    for rec in (data or {}).get("records", []):
        if rec.get("status") in ("fail", "error"):
            return {k: rec.get(k) for k in ("nodeid", "test", "status", "examples", "duration_s", "clauses",
                                            "message", "case")}
    return None
