"""The quick checks run first, and cells a kernel's scope rules out cost nothing (issue 10's speed targets).

- `harness.first`: the first-look pins, then the declared-scope checks, then the argument probes
  come before every other test, so `-x` stops within seconds on most bugs;
- a cell whose property needs a feature the kernel does not declare (masks for flash_attn), or an
  lse the kernel cannot give in that dtype (a convention's float32 lse in float64), is unsupported
  without drawing a single case.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLASH = ["--backend=torch", "--kernel=tests.kernels.flash:flash_attn_func", "--convention=flash_attn"]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_quick_checks_are_collected_first():
    out = _pytest(*FLASH, "--collect-only", "-q").stdout.splitlines()
    ids = [line for line in out if "::" in line]
    files = [i.split("::")[0].split("/")[-1] for i in ids]
    assert files[:4] == ["test_first_look.py"] * 4, files[:6]          # one cell per dtype
    assert files[4:6] == ["test_scope.py"] * 2, files[4:8]
    assert files[6] == "test_arguments.py"
    assert "test_first_look.py" not in files[4:]


def test_cells_outside_the_scope_draw_nothing(tmp_path):
    report = tmp_path / "run.json"
    _pytest(*FLASH, "-q", "--hypothesis-profile=ci", f"--report={report}",
            "-k", "masked_positions_have_no_effect or test_lse_matches_reference")
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(report.read_text())["records"]}
    masks = [r for n, r in records.items() if n.startswith("test_masked_positions_have_no_effect")]
    assert len(masks) == 4 and all(r["status"] == "unsupported" and r["examples"] == 0 for r in masks)
    lse64 = [r for n, r in records.items() if n.startswith("test_lse_matches_reference") and r["dtype"] == "float64"]
    assert len(lse64) == 1 and lse64[0]["status"] == "unsupported" and lse64[0]["examples"] == 0
    assert "lse is float32" in lse64[0]["message"]
    judged = [r for n, r in records.items() if n.startswith("test_lse_matches_reference") and r["dtype"] != "float64"]
    assert len(judged) == 3 and all(r["status"] == "pass" and r["examples_checked"] >= 3 for r in judged)
