"""Mistakes in invoking the suite give a one-line error and exit status 4 (pytest's usage error)."""
import subprocess
import sys
from pathlib import Path

import pytest

from attnconf import adapters

ROOT = Path(__file__).resolve().parent.parent


def suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "conformance", "--co", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [l for l in proc.stderr.splitlines() if l.startswith("ERROR")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("args, expected", [
    (("--backend=nosuch",), "unknown backend 'nosuch'"),
    ((), "--backend is required"),
    (("--backend=numpy", "--device=tpu"), "unknown device 'tpu'"),
    (("--backend=numpy", "--impl=numpy:nope"), "unknown --impl numpy:nope"),
    (("--backend=numpy", "--kernel=no_such_module_xyz:f"), "cannot import 'no_such_module_xyz'"),
    (("--backend=numpy", "--kernel=json:nothing"), "has no attribute 'nothing'"),
    (("--backend=numpy", "--kernel=json:__doc__"), "is not callable"),
    (("--backend=numpy", "--kernel=json:dumps"), "does not take the SDPA convention"),
    (("--backend=numpy", "--kernel=nocolon"), "must look like MODULE:ATTR"),
    (("--backend=numpy", "--report=/proc/attnconf/run.json"), "cannot write there"),
    (("--backend=numpy", "--replay=/nonexistent.npz"), "cannot load the case"),
])
def test_usage_error(args, expected):
    proc = suite(*args)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert expected in error_line(proc)


def test_malformed_divergence_file(tmp_path):
    (tmp_path / "numpy.toml").write_text('[[divergence]]\nid = "X"\nclause = "ATTN-OP-1"\n')
    proc = suite("--backend=numpy", f"--divergences-dir={tmp_path}")
    assert proc.returncode == 4
    line = error_line(proc)
    assert "numpy.toml:1" in line and "missing field 'kind'" in line


def test_framework_not_installed_gives_install_hint(monkeypatch):
    entries = dict(adapters.BACKENDS)
    entries["fakefw"] = adapters.Backend("fakefw", "attnconf.adapters.numpy", ("no_such_framework_xyz",),
                                         ("no-such-framework-xyz",), ("cpu",), "fakefw")
    monkeypatch.setattr(adapters.BACKENDS, "_entries", entries)
    with pytest.raises(adapters.UsageError, match=r"^backend 'fakefw': not installed: needs no_such_framework_xyz; "
                                                  r"install it with: pip install 'attnconf\[fakefw\]'"):
        adapters.load("fakefw")
    assert "fakefw" not in adapters.available_backends()


def test_registered_backend_without_adapter_module(monkeypatch):
    """A backend whose adapter module is not in this attnconf (e.g. not merged yet) is refused in one line."""
    entries = dict(adapters.BACKENDS)
    entries["ghost"] = adapters.Backend("ghost", "attnconf.adapters.no_such_adapter", ("numpy",))
    monkeypatch.setattr(adapters.BACKENDS, "_entries", entries)
    with pytest.raises(adapters.UsageError, match=r"^backend 'ghost': adapter missing: no module "
                                                  r"attnconf\.adapters\.no_such_adapter; this attnconf ships no"):
        adapters.load("ghost")
    assert adapters.BACKENDS["ghost"].status().startswith("adapter missing")
