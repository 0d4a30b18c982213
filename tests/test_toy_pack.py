"""A backend pack from outside attnconf: tests/fixtures/toy_pack/toyattn, registered as the entry point
`toy = toyattn:BACKEND` by a .dist-info on a scratch sys.path, is found and run through the registry
like a built-in pack (its region, alternative, witness and divergences.toml), and nothing outside
the pack is touched. Its one implementation fills rows that see no key with 7.0 and declares so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "tests" / "fixtures" / "toy_pack"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("toy") / "site"
    info = site / "toyattn-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyattn\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnconf.backends]\ntoy = toyattn:BACKEND\n")
    out = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return {**out, "PYTHONPATH": os.pathsep.join([str(site), str(PACK), str(ROOT)])}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_registry_finds_the_pack(env) -> None:
    proc = run(env, "-c", """
import json
from attnconf.adapters.registry import REGISTRY, divergences_file, pack_modules
from attnconf.conformance.engine.divergences import backend_entries
print(json.dumps({"package": REGISTRY["toy"].package, "status": REGISTRY["toy"].status(),
                  "modules": [m for p in ("regions", "alternatives", "witnesses") for m in pack_modules(p)],
                  "file": str(divergences_file("toy")), "ids": [e["id"] for e in backend_entries("toy")]}))
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["package"] == "toyattn" and got["status"] == "installed"
    assert {"toyattn.regions", "toyattn.alternatives", "toyattn.witnesses"} <= set(got["modules"])
    assert got["modules"].index("attnconf.adapters.onnx.regions") < got["modules"].index("toyattn.regions")
    assert got["file"] == str(PACK / "toyattn" / "divergences.toml")
    assert got["ids"] == ["TOY-KEYLESS-ROWS-SEVEN"]


def test_witness_behaves_as_declared(env, tmp_path) -> None:
    """The pack's witness shows the declared behaviour; declared as something else (`zero`, in a
    --divergences-dir copy of the entry) the same witness test fails: the check can fail."""
    test = ["-m", "pytest", "conformance/test_divergences.py", "--backend=toy", "-q", "-p", "no:cacheprovider",
            f"--failures-dir={tmp_path / 'failures'}"]
    proc = run(env, *test)
    assert "1 divergent in" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    toml = (PACK / "toyattn" / "divergences.toml").read_text()
    (tmp_path / "toy.toml").write_text(toml.replace('instead = "toy_sevens"', 'instead = "zero"'))
    wrong = run(env, *test, f"--divergences-dir={tmp_path}")
    assert "1 failed" in wrong.stdout and "behaves neither as the spec says nor as the entry declares" in wrong.stdout, wrong.stdout[-3000:]


def test_conformance_run_uses_the_pack_declaration(env, tmp_path) -> None:
    """A small conformance run: the keyless rows (7.0 where the spec says 0) are judged against the
    pack's declared alternative, and every case is divergent, none failed."""
    proc = run(env, "-m", "pytest", "conformance/test_masks.py", "-k", "fully_masked_rows_are_zero", "--backend=toy",
               "-q", "-p", "no:cacheprovider", f"--failures-dir={tmp_path}")
    assert "4 divergent in" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "backend toy on cpu: 4 divergent" in proc.stdout
