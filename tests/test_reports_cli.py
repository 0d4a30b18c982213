"""`python -m reports`: outputs and exit codes (0 done, 2 refused run file, argparse's 2 for usage)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from attnconf.reports.__main__ import main
from tests.test_reports_fixtures import FIXTURES, GOOD

ROOT = Path(__file__).resolve().parent.parent


def test_merge_writes_site(tmp_path: Path) -> None:
    out = tmp_path / "site"
    assert main(["merge", "--out", str(out), *(str(FIXTURES / n) for n in GOOD)]) == 0
    assert (out / "README.md").read_text(encoding="utf-8").startswith("# attnconf conformance matrix")
    assert (out / "index.html").read_text(encoding="utf-8").startswith("<!doctype html>")
    certs = sorted(p.name for p in (out / "certificates").iterdir())
    # only the kernel run: its certificate as JSON, Markdown and the badge beside it
    assert len(certs) == 3 and [c.rsplit(".", 1)[1] for c in certs] == ["json", "md", "svg"]


def test_merge_refuses_bad_files(tmp_path: Path, capsys) -> None:
    for name, expected in (("bad-version.json", "unsupported schema_version 3"), ("bad-status.json", "'weird'")):
        assert main(["merge", "--out", str(tmp_path / "s"), str(FIXTURES / GOOD[0]), str(FIXTURES / name)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected in err and name in err
    assert not (tmp_path / "s").exists()  # nothing written when an input is refused


def test_validate_subprocess_exit_codes() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "attnconf.reports", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)

    ok = run("validate", str(FIXTURES / "numpy-cpu.json"))
    assert ok.returncode == 0 and "valid" in ok.stdout
    bad = run("validate", str(FIXTURES / "bad-missing-message.json"))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "records[3].message" in bad.stderr
    usage = run("merge", str(FIXTURES / "numpy-cpu.json"))  # --out missing
    assert usage.returncode == 2 and "--out" in usage.stderr
