"""Each flax finding's reproduction script still reproduces (exit 0, "REPRODUCED: ..."), or is skipped
with the script's own reason when its library is missing (exit 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FINDINGS = Path(__file__).resolve().parents[1] / "findings"
SCRIPTS = sorted(FINDINGS.glob("FLAX-*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_reproduction_script_reproduces(script):
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    if run.returncode == 2:
        pytest.skip(last)
    assert run.returncode == 0 and last.startswith("REPRODUCED: "), f"exit {run.returncode}: {last} {run.stderr[-500:]}"
    assert (FINDINGS / f"{script.stem}.md").read_text().startswith(f"# {script.stem}: ")


def test_there_are_findings():
    assert len(SCRIPTS) == 2
