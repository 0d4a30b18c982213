"""Packaging: pyproject agrees with the backend registry, the wheel holds `attnconf` and nothing else
(with every file read at run time), and the pytest11 plugin is registered once and stays inert.

The installed-wheel checks that need a fresh virtual environment are in tests/test_install.py (slow).
"""
from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from attnconf.adapters.registry import BUILTIN, extras, requirement_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
TOP = ("spec", "reference", "adapters", "conformance", "reports")
# every folder with an __init__.py under the mapped folders is a package of the wheel (a nested one left
# out of pyproject's list is missing from the installed attnconf: adapters/conventions once was)
SUBPACKAGES = tuple(sorted(str(d.parent.relative_to(ROOT)) for t in TOP for d in (ROOT / t).rglob("__init__.py")
                           if "__pycache__" not in d.parts))
PLUGIN = "attnconf.conformance.engine.plugin"


def test_extras_are_the_registry() -> None:
    declared = dict(PYPROJECT["project"]["optional-dependencies"])
    declared.pop("dev")
    assert declared == extras()
    for b in BUILTIN:   # every backend's framework is installable through its extra (numpy: core)
        reqs = b.requirements if b.extra else PYPROJECT["project"]["dependencies"]
        names = {requirement_name(r).replace("-", "_") for r in reqs}
        assert all(any(i == n or n.startswith(i) for n in names) for i in b.imports), (b.name, b.imports, reqs)
    assert all(r == "torch==2.13.0" for rs in declared.values() for r in rs if requirement_name(r) == "torch")


def test_wheel_layout_is_declared() -> None:
    """pyproject maps the five folders; setup.py lists every package below them, none by hand."""
    tool = PYPROJECT["tool"]["setuptools"]
    assert tool["package-dir"] == {"attnconf": "attnconf", **{f"attnconf.{t}": t for t in TOP}}
    assert "packages" not in tool   # setup.py's discovery is the one list
    names = ["attnconf", *("attnconf." + s.replace("/", ".") for s in SUBPACKAGES)]
    assert runpy.run_path(str(ROOT / "setup.py"))["packages"]() == sorted(names)
    assert PYPROJECT["project"]["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}
    assert PYPROJECT["project"]["scripts"] == {"attnconf": "attnconf.cli:main"}


def runtime_data_files() -> list[str]:
    """Every non-Python file of the five folders that code reads, as its path inside the wheel."""
    files = [*(ROOT / "spec").glob("*.toml"), *(ROOT / "spec").glob("*.md"), *(ROOT / "spec" / "divergences").glob("*"),
             *(ROOT / "adapters").glob("*/divergences.toml"), *(ROOT / "adapters").glob("*/witnesses/*.npz"),
             ROOT / "reports" / "schema.json",
             ROOT / "conformance" / "pytest-attnconf.ini"]
    return sorted(f"attnconf/{p.relative_to(ROOT)}" for p in files)


def _setuptools_ok() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel` builds from a copy of the tracked files (the checkout stays clean)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, tracked.split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = tmp / "dist"
    isolation = ["--no-build-isolation"] if _setuptools_ok() else []   # the same build, without a fresh build env
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("attnconf-*.whl")
    return whl


def test_wheel_holds_attnconf_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"attnconf", next(t for t in top if t.endswith(".dist-info"))}
    for sub in SUBPACKAGES:
        assert f"attnconf/{sub}/__init__.py" in names
    missing = [f for f in runtime_data_files() if f not in names]
    assert not missing, missing
    assert not any(n.startswith(("attnconf/tests", "attnconf/bench")) or "/runs/" in n or "/gpu/" in n for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert f"[pytest11]\n{PLUGIN} = {PLUGIN}" in entry_points and "attnconf = attnconf.cli:main" in entry_points


# ---- the pytest11 plugin: registered once, inert unless asked -------------------------

def fake_install(tmp: Path, ep_name: str = PLUGIN) -> Path:
    """A dist-info declaring attnconf's pytest11 entry point, as an installed attnconf has (code from the checkout)."""
    site = tmp / "site"
    info = site / "attnconf-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnconf\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\n{ep_name} = {PLUGIN}\n")
    return site


def pytest_run(args: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_checkout_with_attnconf_installed_registers_the_plugin_once(tmp_path: Path) -> None:
    """conftest.py's pytest_plugins and the pytest11 entry point name the same module: loaded once."""
    site = fake_install(tmp_path)
    proc = pytest_run(["conformance", "--backend=numpy", "--co", "-q"], ROOT, site)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "already added" not in proc.stderr
    # guard: under another entry-point name the same module would be registered twice
    other = fake_install(tmp_path / "other", ep_name="attnconf")
    clash = pytest_run(["conformance", "--backend=numpy", "--co", "-q"], ROOT, other)
    assert clash.returncode != 0 and ("already added" in clash.stderr or "already registered" in clash.stderr)


def test_unrelated_suite_runs_unaffected(tmp_path: Path) -> None:
    """Another project's tests, with attnconf's plugin loaded by entry point, run as if it were absent."""
    site = fake_install(tmp_path)
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\naddopts = -q\ntestpaths = tests\n")
    (project / "tests" / "test_things.py").write_text(
        "def test_one():\n    assert 1 + 1 == 2\n\n\ndef test_two():\n    assert 'attnconf' not in __name__\n")
    proc = pytest_run([], project, site)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "attnconf" not in proc.stdout + proc.stderr
    helptext = pytest_run(["--help"], project, site).stdout
    assert "--backend" in helptext   # the plugin was loaded (so its inertness was tested)
