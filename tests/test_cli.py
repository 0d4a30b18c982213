"""The `attnconf` command from a checkout: backends, certify (verdict and exit status, isolation from the
caller's pytest configuration), report, replay, and one-line errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from attnconf.adapters.registry import BUILTIN

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "tests" / "kernels" / "numpy_correct.py"
# A subset of the suite that a kernel without softmax normalisation fails, kept small for speed.
SUBSET = ["--", "-k", "seed_example or test_contracts"]


def cli(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "attnconf", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=full)


def test_backends_lists_the_registry() -> None:
    out = cli("backends", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["backends"]}
    assert list(rows)[: len(BUILTIN)] == [b.name for b in BUILTIN]
    assert rows["numpy"]["installed"] is True and rows["numpy"]["versions"]["numpy"]
    for r in rows.values():
        assert r["status"] == "installed" or r["remedy"], r
    table = cli("backends").stdout
    assert re.search(r"^numpy\s+installed\s", table, re.M)
    names = cli("backends", "--names").stdout.split()
    assert names == [b.name for b in BUILTIN if b.adapter_present()]


def test_certify_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args, expected in ((("--backend", "nosuch", "--kernel", "m:f"), "unknown backend 'nosuch'"),
                           (("--backend", "numpy", "--kernel", "m:f", "--capabilities", str(tmp_path / "no.toml")),
                            "no such file")):
        out = cli("certify", *args, "--out", str(tmp_path / "o"))
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and expected in out.stderr, out.stderr
    # a mistake the suite itself reports (pytest's usage error): no run file, exit 2
    bad = cli("certify", "--backend", "numpy", "--kernel", "no_such_module_xyz:f", "--out", str(tmp_path / "o"))
    assert bad.returncode == 2 and "cannot import 'no_such_module_xyz'" in bad.stderr
    assert "wrote no run file" in bad.stderr and not (tmp_path / "o" / "run.json").exists()


def kernel_repo(tmp_path: Path) -> Path:
    """A caller's repository whose pytest configuration would break any run that read it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(KERNEL, repo / "mykernels.py")
    (repo / "broken.py").write_text(KERNEL.read_text().replace("w = p / np.where(total == 0, 1.0, total)", "w = p"))
    (repo / "pytest.ini").write_text("[pytest]\naddopts = --option-of-the-callers-repo\n")
    (repo / "conftest.py").write_text("raise RuntimeError('the calling repository conftest.py was loaded')\n")
    return repo


def test_certify_report_replay(tmp_path: Path) -> None:
    repo = kernel_repo(tmp_path)
    hostile = {"PYTEST_ADDOPTS": "--another-option-of-the-caller"}
    # the whole suite: a certificate needs every in-scope cell (a -k subset would be INCOMPLETE)
    ok = cli("certify", "--backend", "numpy", "--kernel", "mykernels:sdpa", "--profile", "dev", "--out", "good",
             cwd=repo, env=hostile)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert re.search(r"^verdict: CONFORMANT$", ok.stdout, re.M)
    cert = json.loads((repo / "good" / "certificate.json").read_text())
    assert cert["verdict"] == "CONFORMANT" and cert["kernel"] == "mykernels:sdpa" and cert["cells_by_status"]["conformant"]
    assert (repo / "good" / "certificate.md").read_text().startswith("## attnconf certificate: mykernels:sdpa")

    bad = cli("certify", "--backend", "numpy", "--kernel", "broken:sdpa", "--profile", "dev", "--out", "bad",
              *SUBSET, cwd=repo, env=hostile)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    assert re.search(r"^verdict: NONCONFORMANT \(failed clauses: ", bad.stdout, re.M)
    assert json.loads((repo / "bad" / "certificate.json").read_text())["verdict"] == "NONCONFORMANT"
    # a failed run leaves no stale verdict: a second run that cannot start removes the old files
    again = cli("certify", "--backend", "numpy", "--kernel", "no_such_module_xyz:f", "--out", "bad", cwd=repo)
    assert again.returncode == 2 and not (repo / "bad" / "certificate.json").exists()

    site = cli("report", str(repo / "good" / "run.json"), "--out", str(tmp_path / "site"))
    assert site.returncode == 0 and (tmp_path / "site" / "README.md").is_file(), site.stderr

    failures = sorted((repo / "bad" / "failures").glob("*.npz"))
    assert failures, "the failing run saved no case"
    shown = cli("replay", str(failures[0]))
    assert shown.returncode == 0 and shown.stdout.startswith("case: ") and "--backend" in shown.stdout
    replayed = cli("replay", str(failures[0]), "--backend", "numpy", "--kernel", "broken:sdpa", cwd=repo)
    assert replayed.returncode == 1 and "FAIL" in replayed.stdout, replayed.stdout[-2000:]
    fixed = cli("replay", str(failures[0]), "--backend", "numpy", "--kernel", "mykernels:sdpa", cwd=repo)
    assert fixed.returncode == 0, fixed.stdout[-2000:]
