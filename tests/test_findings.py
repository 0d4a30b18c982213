"""The findings (reports/findings/ and every backend pack's findings/) stay true and stay in the format.

Every `<ID>.py` runs in its own process (the project's interpreter, a scratch
working directory, so nothing of attnconf is importable) and must report what its write-up's
status says: exit 0 with a `REPRODUCED:` line while the status is `reproduces`, exit 1 with a
`NOT REPRODUCED:` line once it is `fixed`. Exit 2 with `CANNOT RUN:` (the target library is not
installed, or the platform cannot exercise the defect) skips with that reason. Any other outcome
(a traceback, a crash, a missing verdict line, a timeout) fails.

The write-ups are parsed by attnconf.reports.findings_index (header table, sections, clause ids)
and the committed index in reports/findings/README.md must be the generated one. Findings added
by anyone are picked up by globbing; nothing here lists them.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from attnconf.reports import findings_index as fi

ROOT = Path(__file__).resolve().parent.parent
# finding id -> its folder (reports/findings/ or adapters/<backend>/findings/)
HOME = {p.stem: d for d in fi.folders() for p in [*d.glob("*.py"), *d.glob("*.md")] if p.name != "README.md"}
IDS = sorted(HOME)
TIMEOUT_S = 300
# What a reproduction may not import: the project itself, or its test machinery.
FORBIDDEN_IMPORTS = {"attnconf", "spec", "reference", "adapters", "conformance", "reports", "tests",
                     "bench", "hypothesis", "pytest", "mpmath", "conftest"}


def _run(script: Path, workdir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        return subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, returncode=None, stdout=exc.stdout or "",
                                           stderr=f"timed out after {TIMEOUT_S} s")


class _Runner:
    """Runs the reproductions two at a time (this machine's cores), each at most once per session.
    Under xdist each worker runs only the scripts its own tests ask for."""

    def __init__(self, workdir: Path, scripts: list[Path]) -> None:
        self.workdir = workdir
        self.futures: dict[Path, Future] = {}
        parallel = "PYTEST_XDIST_WORKER" not in os.environ and len(scripts) > 1
        self.pool = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) if parallel else None
        if self.pool:
            for script in scripts:
                self.futures[script] = self.pool.submit(_run, script, workdir)

    def result(self, script: Path) -> subprocess.CompletedProcess:
        if script not in self.futures:
            return _run(script, self.workdir)
        return self.futures[script].result()


@pytest.fixture(scope="module")
def runner(request, tmp_path_factory):
    # Start only the reproductions this session selected (-k, node ids), all of them at once.
    selected = [HOME[item.callspec.params["fid"]] / f"{item.callspec.params['fid']}.py" for item in request.session.items
                if getattr(item, "originalname", None) == "test_reproduction" and hasattr(item, "callspec")]
    r = _Runner(tmp_path_factory.mktemp("findings"), [s for s in selected if s.is_file()])
    yield r
    if r.pool:
        r.pool.shutdown(wait=True, cancel_futures=True)


def _verdict_line(stdout: str, prefix: str) -> str | None:
    return next((line for line in stdout.splitlines() if line.startswith(prefix)), None)


def _tail(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stdout or "")[-1500:] + "\n--- stderr ---\n" + (proc.stderr or "")[-1500:]
    return text.strip()


@pytest.mark.parametrize("fid", IDS)
def test_finding_has_script_and_writeup(fid):
    assert (HOME[fid] / f"{fid}.py").is_file(), f"finding {fid} has a write-up but no reproduction script {fid}.py"
    assert (HOME[fid] / f"{fid}.md").is_file(), f"finding {fid} has a reproduction script but no write-up {fid}.md"


@pytest.mark.parametrize("fid", IDS)
def test_writeup_format(fid):
    path = HOME[fid] / f"{fid}.md"
    if not path.is_file():
        pytest.fail(f"finding {fid} has no write-up")
    finding = fi.parse(path, fi.known_clause_ids())
    text = path.read_text(encoding="utf-8")
    reproduction = text.split("## Reproduction", 1)[1].split("## Draft upstream report", 1)[0]
    assert f"{fid}.py" in reproduction, f"{fid}.md: the Reproduction section does not name {fid}.py"
    assert "REPRODUCED:" in reproduction or "NOT REPRODUCED:" in reproduction, \
        f"{fid}.md: the Reproduction section does not show the script's verdict line"
    assert finding.fields["versions"], f"{fid}.md: versions row is empty"


@pytest.mark.parametrize("fid", IDS)
def test_script_is_self_contained(fid):
    """Only the target library, NumPy and the standard library: no attnconf, no test machinery."""
    path = HOME[fid] / f"{fid}.py"
    if not path.is_file():
        pytest.fail(f"finding {fid} has no reproduction script")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import"
            imported.add((node.module or "").split(".")[0])
    bad = sorted(imported & FORBIDDEN_IMPORTS)
    assert not bad, f"{path.name} imports {', '.join(bad)}: a reproduction needs only the target library and NumPy"
    source = path.read_text(encoding="utf-8")
    for verdict in ("REPRODUCED:", "NOT REPRODUCED:", "CANNOT RUN:"):
        assert verdict in source, f"{path.name} never prints a '{verdict}' line"


def _check_reproduction(fid: str, directory: Path, runner) -> None:
    """Fail, skip or return according to the script's outcome and the write-up's status."""
    script, writeup = directory / f"{fid}.py", directory / f"{fid}.md"
    if not script.is_file() or not writeup.is_file():
        pytest.fail(f"finding {fid} lacks its script or its write-up")
    status = fi.parse(writeup, None).status
    proc = runner.result(script)
    if proc.returncode is None:
        pytest.fail(f"finding {fid}: {script.name} timed out after {TIMEOUT_S} s\n{_tail(proc)}")
    if proc.returncode == 2:
        line = _verdict_line(proc.stdout, "CANNOT RUN:")
        if line is None:
            pytest.fail(f"finding {fid}: {script.name} exited 2 without a 'CANNOT RUN:' line\n{_tail(proc)}")
        pytest.skip(f"finding {fid}: {line}")
    if proc.returncode == 0:
        line = _verdict_line(proc.stdout, "REPRODUCED:")
        if line is None:
            pytest.fail(f"finding {fid}: {script.name} exited 0 without a 'REPRODUCED:' line\n{_tail(proc)}")
        if status == "fixed":
            pytest.fail(f"finding {fid} reproduces again although its status is 'fixed': {line}")
        return
    if proc.returncode == 1:
        line = _verdict_line(proc.stdout, "NOT REPRODUCED:")
        if line is None:
            pytest.fail(f"finding {fid}: {script.name} failed (exit 1, no 'NOT REPRODUCED:' line; "
                        f"a traceback?)\n{_tail(proc)}")
        if status == "fixed":
            return
        pytest.fail(f"finding {fid} no longer reproduces: update its status and the divergence entry\n{line}")
    pytest.fail(f"finding {fid}: {script.name} ended with exit status {proc.returncode} (a crash?)\n{_tail(proc)}")


@pytest.mark.parametrize("fid", IDS)
def test_reproduction(fid, runner):
    _check_reproduction(fid, HOME[fid], runner)


def test_index_is_current():
    current = fi.README.read_text(encoding="utf-8")
    wanted = fi.splice(current, fi.render_index(fi.load_all()))
    assert current == wanted, ("reports/findings/README.md's index is stale: "
                               "run .venv/bin/python -m attnconf.reports.findings_index")


def test_index_lists_every_finding():
    text = fi.README.read_text(encoding="utf-8")
    for fid in IDS:
        assert f"[{fid}]({fi.link(HOME[fid] / f'{fid}.md')})" in text, f"reports/findings/README.md does not list {fid}"


# ---- the checker itself can fail (a test that cannot fail is a defect) -----------------------

GOOD = """# DEMO-LIB-THING: a demo
| field | value |
|---|---|
| target | demo |
| versions | demo 1.0 |
| status | reproduces |
| spec clause | {clause} |
| kind | bug |

## What the spec says
x
## What the implementation does
x
## Reproduction
`DEMO-LIB-THING.py` prints REPRODUCED: x
## Draft upstream report
x
"""


def _clause() -> str:
    return next(iter(sorted(fi.known_clause_ids())))


def test_parser_accepts_the_format(tmp_path):
    path = tmp_path / "DEMO-LIB-THING.md"
    path.write_text(GOOD.format(clause=_clause()))
    finding = fi.parse(path, fi.known_clause_ids())
    assert (finding.id, finding.status, finding.clauses) == ("DEMO-LIB-THING", "reproduces", [_clause()])


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("# DEMO-LIB-THING: a demo", "# OTHER-ID: a demo"), "file is named"),
    (lambda t: t.replace("| status | reproduces |\n", ""), "lacks row.*status"),
    (lambda t: t.replace("| status | reproduces |", "| status | maybe |"), "status must be"),
    (lambda t: t.replace("| kind | bug |", "| kind | feature |"), "kind must be"),
    (lambda t: t.replace("## Draft upstream report\n", ""), "missing section"),
    (lambda t: t.replace("## What the spec says\nx\n## What the implementation does",
                         "## What the implementation does\nx\n## What the spec says"), "order"),
    (lambda t: t.replace("| kind | bug |", "| kind | bug |\n| kind | bug |"), "appears twice"),
    (lambda t: t.replace("| target | demo |", "| target demo |"), "is not '. field . value .'"),
    (lambda t: t.replace("| spec clause | ", "| spec clause | see "), None),
])
def test_parser_rejects_malformed(tmp_path, mutate, message):
    path = tmp_path / "DEMO-LIB-THING.md"
    path.write_text(mutate(GOOD.format(clause=_clause())))
    if message is None:  # a control mutation that must still parse
        fi.parse(path, fi.known_clause_ids())
        return
    with pytest.raises(fi.FindingFormatError, match=message):
        fi.parse(path, fi.known_clause_ids())


def test_parser_is_lenient_where_the_format_is(tmp_path):
    """Extra rows, another column-title row, capitalised values and section titles are accepted."""
    text = (GOOD.format(clause=_clause()).replace("| field | value |", "| Row | Value |")
            .replace("| reproduces |", "| Reproduces |").replace("| kind | bug |", "| Kind | Bug |\n| link | x |")
            .replace("## What the spec says", "## What the Spec says"))
    path = tmp_path / "DEMO-LIB-THING.md"
    path.write_text(text)
    finding = fi.parse(path, fi.known_clause_ids())
    assert (finding.status, finding.fields["kind"], finding.fields["link"]) == ("reproduces", "bug", "x")


def test_parser_rejects_unknown_clause(tmp_path):
    path = tmp_path / "DEMO-LIB-THING.md"
    path.write_text(GOOD.format(clause="ATTN-" + "NOPE-99"))
    with pytest.raises(fi.FindingFormatError, match="unknown spec clause"):
        fi.parse(path, fi.known_clause_ids())


def test_stale_index_is_detected():
    stale = fi.README.read_text(encoding="utf-8").replace("| reproduces |", "| fixed |", 1)
    assert fi.splice(stale, fi.render_index(fi.load_all())) != stale


class _Fake:
    def __init__(self, code, stdout):
        self.code, self.stdout = code, stdout

    def result(self, script):
        return subprocess.CompletedProcess([], returncode=self.code, stdout=self.stdout, stderr="")


def _demo(tmp_path, status="reproduces") -> str:
    fid = "DEMO-LIB-THING"
    (tmp_path / f"{fid}.md").write_text(GOOD.format(clause=_clause()).replace("| reproduces |", f"| {status} |"))
    (tmp_path / f"{fid}.py").write_text("")
    return fid


@pytest.mark.parametrize("status, code, stdout, expect", [
    ("reproduces", 1, "NOT REPRODUCED: gone\n", "no longer reproduces: update its status and the divergence entry"),
    ("reproduces", 1, "Traceback (most recent call last):\n", "no 'NOT REPRODUCED:' line"),
    ("reproduces", 0, "all fine\n", "without a 'REPRODUCED:' line"),
    ("reproduces", -11, "", "exit status -11"),
    ("reproduces", None, "", "timed out"),
    ("reproduces", 2, "ImportError\n", "without a 'CANNOT RUN:' line"),
    ("fixed", 0, "REPRODUCED: back\n", "reproduces again although its status is 'fixed'"),
])
def test_reproduction_verdicts_fail_as_specified(tmp_path, status, code, stdout, expect):
    """Drive the check with fake script outcomes: each wrong outcome must fail it."""
    fid = _demo(tmp_path, status)
    with pytest.raises(pytest.fail.Exception, match=expect):
        _check_reproduction(fid, tmp_path, _Fake(code, stdout))


@pytest.mark.parametrize("status, code, stdout", [
    ("reproduces", 0, "noise\nREPRODUCED: it does\n"),
    ("fixed", 1, "NOT REPRODUCED: fixed upstream\n"),
])
def test_reproduction_verdicts_pass_as_specified(tmp_path, status, code, stdout):
    _check_reproduction(_demo(tmp_path, status), tmp_path, _Fake(code, stdout))


def test_cannot_run_skips(tmp_path):
    with pytest.raises(pytest.skip.Exception, match="No module named"):
        _check_reproduction(_demo(tmp_path), tmp_path, _Fake(2, "CANNOT RUN: No module named 'x'\n"))
