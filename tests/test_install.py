"""attnconf as a kernel author gets it: installed into a fresh virtual environment outside the checkout.

Slow (a venv and its packages; `make test-install` runs them): the wheel with NumPy only (numpy
backend, an honest NumPy kernel copied into a scratch "kernel repository" whose own pytest.ini and
conftest.py would break any run that read them; then the checkout installed editable over it, as
`make setup` installs it), and `pip install <checkout> torch==2.13.0` with
an honest torch kernel, the issue's done-when check.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnconf
from tests.test_packaging import wheel  # noqa: F401 (session fixture: the built wheel)

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
pytestmark = pytest.mark.slow


def sh(args: list[str], cwd: Path, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})})


def fresh_venv(where: Path, *requirements: str) -> Path:
    """A venv (no pip of its own: this interpreter's pip installs into it) holding `requirements`."""
    venv = where / "venv"
    made = sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], where)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    constraints = ["-c", str(LOCK)] if LOCK.exists() else []
    proc = sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *constraints, *requirements],
              where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def kernel_repository(where: Path, kernel_source: Path, module: str) -> Path:
    """A folder playing a kernel repository: the kernel module, and pytest config that must not leak in."""
    repo = where / "kernel-repo"
    repo.mkdir()
    shutil.copy(kernel_source, repo / f"{module}.py")
    (repo / "pytest.ini").write_text("[pytest]\naddopts = --option-of-the-callers-repo\n")
    (repo / "conftest.py").write_text("raise RuntimeError('the calling repository conftest.py was loaded')\n")
    return repo


def certify(python: Path, repo: Path, backend: str, kernel: str) -> subprocess.CompletedProcess[str]:
    attnconf = python.parent / "attnconf"
    return sh([str(attnconf), "certify", "--backend", backend, "--kernel", kernel, "--out", "out"], repo,
              env={"PYTEST_ADDOPTS": "--another-option-of-the-caller", "OPENBLAS_NUM_THREADS": "1"})


def top_level_of_installed_files(python: Path) -> set[str]:
    show = sh([sys.executable, "-m", "pip", "--python", str(python), "show", "-f", "attnconf"], python.parent)
    assert show.returncode == 0, show.stderr
    files = show.stdout.split("Files:", 1)[1].split()
    return {f.split("/")[0] for f in files if not f.startswith("..")}   # ../../../bin/attnconf is the script


def test_wheel_in_a_fresh_venv_with_numpy_only(tmp_path: Path, wheel: Path) -> None:  # noqa: F811
    python = fresh_venv(tmp_path, str(wheel))
    assert top_level_of_installed_files(python) == {"attnconf", f"attnconf-{attnconf.__version__}.dist-info"}
    # an installed attnconf does not extend its __path__ (the folders are inside it)
    path = sh([str(python), "-c", "import attnconf, attnconf.spec; print(list(attnconf.__path__)); "
                                  "print(attnconf.spec.clauses()['ATTN-OP-1']['id'])"], tmp_path)
    assert path.returncode == 0, path.stderr
    (where,) = eval(path.stdout.splitlines()[0])   # exactly one entry
    assert Path(where).parent.name == "site-packages" and path.stdout.splitlines()[1] == "ATTN-OP-1"
    assert sh([str(python), "-c", "import torch"], tmp_path).returncode != 0   # NumPy only

    repo = kernel_repository(tmp_path, ROOT / "tests" / "kernels" / "numpy_correct.py", "mykernels")
    proc = certify(python, repo, "numpy", "mykernels:sdpa")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^verdict: CONFORMANT$", proc.stdout, re.M), proc.stdout[-2000:]
    for name in ("run.json", "certificate.md", "certificate.json"):
        assert (repo / "out" / name).is_file(), name
    # a kernel that is not correct is refused (the command can fail)
    (repo / "broken.py").write_text((ROOT / "tests" / "kernels" / "numpy_correct.py").read_text()
                                    .replace("w = p / np.where(total == 0, 1.0, total)", "w = p"))
    bad = certify(python, repo, "numpy", "broken:sdpa")
    assert bad.returncode == 1 and "verdict: NONCONFORMANT" in bad.stdout, bad.stdout[-3000:]

    # an unrelated test suite in another folder runs as if attnconf were not installed
    other = tmp_path / "other-project"
    (other / "tests").mkdir(parents=True)
    (other / "tests" / "test_other.py").write_text("def test_a():\n    assert True\n\n\ndef test_b():\n    assert 2 > 1\n")
    run = sh([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], other)
    assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
    assert "--backend" in sh([str(python), "-m", "pytest", "--help"], other).stdout   # loaded by entry point

    # in the checkout, whose attnconf/ shadows the wheel, an import says in one line to install the checkout
    shadowed = sh([str(python), "-c", "import attnconf"], ROOT)
    assert shadowed.returncode == 1 and "run `make setup`" in shadowed.stderr.splitlines()[-1], shadowed.stderr

    # the checkout installed editable over the wheel (as make setup does): its folders under their attnconf.
    # names and nothing else, and the plugin registered once though conftest.py names it too
    editable = sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "-e", str(ROOT)],
                  tmp_path)
    assert editable.returncode == 0, editable.stderr[-3000:]
    names = sh([str(python), "-c", "import importlib.util as u, attnconf.spec; print(attnconf.spec.__file__); "
                                   "print(u.find_spec('attnconf.bench'), u.find_spec('attnconf.attnconf'))"], tmp_path)
    assert names.stdout.split() == [str(ROOT / "spec" / "__init__.py"), "None", "None"], names.stdout + names.stderr
    co = sh([str(python), "-m", "pytest", "conformance", "--backend=numpy", "--co", "-q", "-p", "no:cacheprovider"],
            ROOT)
    assert co.returncode == 0 and "already added" not in co.stderr, co.stdout[-2000:] + co.stderr[-2000:]


def test_checkout_with_torch_in_a_fresh_venv(tmp_path: Path) -> None:
    """The issue's done-when: `pip install <checkout> torch==2.13.0`, then certify an honest torch kernel."""
    src = tmp_path / "checkout"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "reports",
                                                             "__pycache__", ".hypothesis", ".attnconf-ci"))
    shutil.copytree(ROOT / "reports", src / "reports", ignore=shutil.ignore_patterns("runs", "gpu", "failures"))
    python = fresh_venv(tmp_path, str(src), "torch==2.13.0")
    assert top_level_of_installed_files(python) == {"attnconf", f"attnconf-{attnconf.__version__}.dist-info"}
    repo = kernel_repository(tmp_path, ROOT / "tests" / "kernels" / "correct.py", "mykernel")
    proc = certify(python, repo, "torch", "mykernel:naive")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^verdict: CONFORMANT$", proc.stdout, re.M), proc.stdout[-2000:]
