"""requirements.lock: it covers every requirement of pyproject (so every backend of the registry), and the
versions recorded in the committed run files are the lock's (reports are reproducible from it)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from attnconf.adapters.registry import BUILTIN, requirement_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
RUNS = sorted((ROOT / "reports" / "runs").glob("*.json"))
VERSION_KEYS = ("flax", "keras", "jaxlib")   # versions an implementation's describe() records besides its framework's


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"requirements.lock: not a pin: {line!r}"
            out[norm(name)] = version
    return out


def distribution_of(framework: str, locked: dict[str, str]) -> str | None:
    """The locked distribution that provides an import name: itself, else a backend requirement named after it."""
    candidates = [framework] + [requirement_name(r) for b in BUILTIN if framework in b.imports for r in b.requirements
                                if norm(requirement_name(r)).startswith(norm(framework))]
    return next((norm(c) for c in candidates if norm(c) in locked), None)


def mismatches(run: dict[str, Any], locked: dict[str, str]) -> list[str]:
    env = run["environment"]
    recorded = dict(env.get("frameworks") or {})
    for described in (env.get("implementations") or {}).values():
        for key in VERSION_KEYS:
            if isinstance(described, dict) and described.get(key):
                recorded[key] = described[key]
    out = []
    for framework, version in sorted(recorded.items()):
        dist = distribution_of(framework, locked)
        if dist is None:
            out.append(f"{framework} {version}: not in the lock")
        elif locked[dist] != version:
            out.append(f"{framework} {version} != lock {dist}=={locked[dist]}")
    return out


def test_lock_covers_every_requirement() -> None:
    listed = subprocess.run([sys.executable, str(ROOT / "tools" / "requirements.py")], capture_output=True, text=True,
                            check=True).stdout.split()
    locked = pins()
    missing = [r for r in listed if norm(requirement_name(r)) not in locked]
    assert not missing, f"requirements.lock lacks {missing}: run `make lock`"
    assert locked["torch"].startswith("2.13.0")
    for b in BUILTIN:   # every framework of the registry is pinned
        assert all(distribution_of(i, locked) for i in b.imports), b.name


def test_committed_run_files_record_the_locked_versions() -> None:
    assert RUNS, "no committed run files under reports/runs"
    locked = pins()
    problems = {p.name: mismatches(json.loads(p.read_text(encoding="utf-8")), locked) for p in RUNS}
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, f"run files recorded other versions than requirements.lock (re-run `make report`): {problems}"


def test_mismatch_is_detected() -> None:
    """Guard: a run file whose numpy differs from the lock is reported."""
    locked = pins()
    run = json.loads(RUNS[0].read_text(encoding="utf-8"))
    run["environment"]["frameworks"]["numpy"] = "0.0.1"
    assert any(m.startswith("numpy 0.0.1") for m in mismatches(run, locked))
