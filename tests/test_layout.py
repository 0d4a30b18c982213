"""The package layout: every module imports attnconf's subpackages by their `attnconf.` name.

In a checkout the repository root is on sys.path, so `import reference` would still work and
would load a second copy of the module next to `attnconf.reference` (two `Case` classes, two
plugin states). Only `attnconf.*` names exist in an installed wheel, so this test keeps the
checkout honest.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = {"spec", "adapters", "reference", "conformance", "reports"}
SOURCES = [p for d in (*SUBPACKAGES, "attnconf", "tests", "bench") for p in (ROOT / d).rglob("*.py")]
# reports/real/ holds wrappers of third-party implementations, run as `--kernel reports.real.X.kernel:fn` from the
# repository root as a user's own repository would run its kernel; they are not in the wheel (no __init__.py)
OUTSIDE_THE_PACKAGE = "reports.real"


def test_no_top_level_subpackage_imports() -> None:
    offenders = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}"
                          for n in names if n.split(".")[0] in SUBPACKAGES
                          and not (n + ".").startswith(OUTSIDE_THE_PACKAGE + ".")]
    assert not offenders, "\n".join(offenders)


def test_only_the_mapped_folders_are_subpackages() -> None:
    """The checkout imports as the wheel does: no `attnconf.bench`, no `attnconf.attnconf.cli`, no
    `attnconf.tests` (they once imported, when attnconf's `__path__` covered the repository root)."""
    import attnconf

    assert [Path(p) for p in attnconf.__path__] == [ROOT / "attnconf"]
    for name in ("attnconf.bench", "attnconf.attnconf", "attnconf.tests", "attnconf.tools"):
        assert importlib.util.find_spec(name) is None, name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("attnconf.attnconf.cli")
    assert Path(importlib.import_module("attnconf.spec").__file__).parent == ROOT / "spec"


def test_a_checkout_not_installed_says_to_run_make_setup() -> None:
    """Without site-packages (-S: no editable install) the checkout's attnconf fails on import, in one line."""
    proc = subprocess.run([sys.executable, "-S", "-c", "import attnconf"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("ImportError: attnconf: the checkout") and "make setup" in last, \
        proc.stderr
