"""Hostile kernels through the whole suite under --isolate: every run finishes, says what
happened in a per-test status, and writes a complete report (issue: certifying untrusted kernels).

The numpy backend is used so the worker starts in a fraction of a second; the kernels only use
operations NumPy and torch share.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# kernel -> (status of the agreement test's record, text in its message)
EXPECTED = {
    "segfault": ("crashed", "SIGSEGV"),
    "hang": ("timeout", "no answer after 3 s"),
    "alloc_unbounded": ("crashed", "out of memory"),
    "returns_nan": ("fail", "ATTN-TOL-3"),
    "wrong_shape": ("fail", "ATTN-OP-2"),
    "mutates_inputs": ("fail", "mutated its input"),
    "raises_always": ("fail", "kernel raised"),
    "returns_list": ("fail", "not an array"),
}


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_hostile_kernel_gets_its_status_and_the_run_completes(kernel, tmp_path):
    report = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "--backend=numpy", f"--kernel=tests.kernels.hostile:{kernel}",
         "--isolate", f"--case-timeout={3 if kernel == 'hang' else 30}", "--memory-limit=0.5", "--hypothesis-profile=ci",
         "-q", "-p",
         "no:cacheprovider", "-k", "test_output_matches_reference or test_output_shape_and_dtype",
         f"--report={report}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(report.read_text())
    assert run["verdict"]["verdict"] == "NONCONFORMANT"
    by_test: dict[str, list] = {}
    for r in run["records"]:
        by_test.setdefault(r["test"], []).append(r)
    assert set(by_test) == {"test_output_matches_reference", "test_output_shape_and_dtype"}, "a test lost its record"
    assert all(len(recs) == 4 for recs in by_test.values()), "a dtype cell lost its record"
    status, text = EXPECTED[kernel]
    recs = by_test["test_output_matches_reference"]
    assert all(r["status"] in ("fail", "crashed", "timeout") for r in recs), [r["status"] for r in recs]
    assert any(r["status"] == status for r in recs), [r["status"] for r in recs]
    rec = next(r for r in recs if text in r["message"])
    assert rec["case"] and rec["replay"] and Path(rec["failure_file"]).exists(), rec
    if kernel == "hang":   # after two timed-out calls the kernel is not called again: the run ends in seconds
        assert any("not called" in r["message"] for r in run["records"])
    # the run went on after the first test: the second one has records of its own
    assert any(r["status"] in ("crashed", "timeout", "fail") for r in by_test["test_output_shape_and_dtype"])


def test_replay_fails_the_same_way_every_time(tmp_path):
    """The printed replay command reproduces exactly the saved failure, run after run."""
    def suite(*args):
        return subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    report = tmp_path / "run.json"
    suite("conformance", "--backend=numpy", "--kernel=tests.kernels.hostile:returns_nan", "-x",
          "--hypothesis-profile=ci", f"--report={report}")
    rec = next(r for r in json.loads(report.read_text())["records"] if r["status"] == "fail")
    args = rec["replay"].split()[3:]              # drop "python -m pytest"
    outcomes = []
    for _ in range(2):
        proc = suite(*[a.strip("'") for a in args])
        assert proc.returncode == 1
        outcomes.append([line for line in proc.stdout.splitlines() if line.startswith("  FAILED")])
    assert outcomes[0] == outcomes[1] and rec["message"] in outcomes[0][0]


def test_a_kernel_that_writes_into_its_mask_is_caught():
    """ATTN-OP-8: the adapter snapshots every array argument, the mask included, not only Q, K and V."""
    import numpy as np

    from attnconf import adapters
    from attnconf.adapters import ConventionViolation
    from attnconf.reference import Case

    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(1, 2, 5, 4)), rng.normal(size=(1, 2, 5, 4))
    case = Case.build(q, k, v, dtype="float32", bias=rng.normal(size=(1, 2, 3, 5)))
    adapter = adapters.load("numpy", kernel="tests.kernels.hostile:mutates_mask")[0]
    with pytest.raises(ConventionViolation) as info:
        adapter.run(case)
    assert info.value.clause == "ATTN-OP-8" and "attn_mask" in str(info.value)
    assert adapter.run(case.replace(bias=None)).out.shape == (1, 2, 3, 4)
