"""The branch-point catalogue (tests/kernels/branch_bugs.py): each defect lives on one branch path, and the
branch-point sweep (conformance/test_branch_points.py) catches it there, naming that branch point.

Fast: each bug differs from the float64 reference on its witness, the grid case of its boundary in its family
(conformance/branch_cases.branch_case), and agrees with it on the same family at a shape that crosses none of
its boundaries (the plain family, for the defects of ALiBi itself); the SDPA control agrees on every witness.
Slow: `pytest conformance -k test_each_boundary_in_each_family -x` under the ci profile, narrowed to the dtype
cell in which the sweep runs the bug's witness, fails each bug with a message naming one of its boundaries; the
SDPA control passes the whole sweep in every dtype. (The numpy and flash_attn controls, variant_bugs.correct
and flash.flash_attn_func, run the whole ci suite, this sweep included, in tests/test_variant_catalogue.py and
tests/test_catalogue_conventions.py.)
"""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="the branch catalogue is written in torch, which is not installed")

if importlib.util.find_spec("torch") is not None:
    from attnconf import adapters
    from attnconf.conformance import test_branch_points as sweep
    from attnconf.conformance.strategies import palette
    from attnconf.conformance.strategies.boundaries import BY_ID
    from attnconf.conformance.strategies.branch_cases import BRANCH_FAMILIES, branch_case
    from attnconf.conformance.strategies import DTYPES
    from attnconf.reference import Case, backward, oracle
    from bench.runner import run_suite
    from tests.kernels import branch_bugs

    BUGS = sorted(branch_bugs.BUGS)
else:  # collected but skipped
    BUGS = []

CLEAR = "Lk>64"          # a boundary none of the catalogue's branches takes (one batch, two heads, 9 x 65)
AT = re.compile(r"at branch point (\S+) \(.*?\), family (\w+)")


def adapter(name: str):
    conv = "sdpa" if name == "sdpa_branch_control" else branch_bugs.BUGS[name].convention
    backend = "numpy" if conv == "numpy" else "torch"
    return adapters.load(backend, kernel=f"tests.kernels.branch_bugs:{name}",
                         **({} if conv in ("sdpa", "numpy") else {"convention": conv}))[0]


def shape_free(name: str) -> bool:
    """A defect of ALiBi itself (every boundary shows it), not of a shape."""
    return branch_bugs.BUGS[name].boundaries == branch_bugs.ANY


def errors(impl, case: "Case") -> dict[str, float]:
    """Worst |kernel - reference| of the output, the lse where returned, and the gradients where asked;
    inf where one side is not finite and the other is (or both are, differently)."""
    grads = case.grad_out is not None
    res = impl.run(case, grads=grads)
    ref = oracle(case)
    pairs = {"out": (res.out, ref.out)}
    if res.lse is not None:
        pairs["lse"] = (res.lse, ref.lse)
    if grads:
        bw = backward(case)
        pairs.update({g: (res.grads[g], getattr(bw, g)) for g in ("dq", "dk", "dv")})
    out = {}
    for key, (got, want) in pairs.items():
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            same_inf = (got == want) & ~np.isfinite(want)
            err = np.where(same_inf, 0.0, np.abs(got - want))
        out[key] = float(np.where(np.isnan(err), np.inf, err).max(initial=0.0))
    return out


def witness(name: str, dtype: str = "float64") -> "Case":
    bug = branch_bugs.BUGS[name]
    return branch_case(BY_ID[bug.boundaries[0]], bug.family, dtype)


def test_catalogue_is_complete():
    assert len(BUGS) >= 10
    assert {branch_bugs.BUGS[n].convention for n in BUGS} >= {"sdpa", "numpy", "flash_attn"}
    for name in BUGS:
        bug = branch_bugs.BUGS[name]
        assert bug.defect.startswith("Defect"), name
        assert bug.family in BRANCH_FAMILIES and set(bug.boundaries) <= set(BY_ID), name
        assert CLEAR not in bug.boundaries or shape_free(name), name


@pytest.mark.parametrize("name", BUGS)
def test_bug_differs_from_the_reference_on_its_witness(name):
    bug = branch_bugs.BUGS[name]
    # the flash_attn convention returns no lse in float64: the lse defect shows in float32
    case = witness(name, "float32" if name == "fa_alibi_lse_no_bias" else "float64")
    err = errors(adapter(name), case)
    worst = max(err.values())
    assert worst > 1e-2, f"{name}: no visible defect at {bug.boundaries[0]} / {bug.family}: {err}"
    if name == "fa_alibi_lse_no_bias":
        assert err["out"] < 1e-5 < 1e-2 < err["lse"], err    # the output is right, only the lse is wrong


@pytest.mark.parametrize("name", BUGS)
def test_bug_agrees_with_the_reference_off_its_branch(name):
    family = "plain" if shape_free(name) else branch_bugs.BUGS[name].family
    err = errors(adapter(name), branch_case(BY_ID[CLEAR], family, "float64"))
    assert max(err.values()) < 1e-10, f"{name} differs off its branch ({CLEAR} / {family}): {err}"


@pytest.mark.parametrize("name", sorted({n for n in BUGS if branch_bugs.BUGS[n].convention == "sdpa"}))
def test_sdpa_control_agrees_on_the_witness(name):
    err = errors(adapter("sdpa_branch_control"), witness(name))
    assert max(err.values()) < 1e-10, f"the control differs at {name}'s witness: {err}"


# ---- the sweep against the catalogue (slow: one dtype cell of the sweep per bug) ----------------------
def cell_dtype(name: str, dtypes: tuple[str, ...], monkeypatch) -> tuple[str, str]:
    """(boundary, dtype): the bug's first boundary whose grid case the ci sweep runs in a dtype that shows the
    defect, and that dtype (test_branch_points._runs_here's rotation, whatever profile this process has)."""
    bug = branch_bugs.BUGS[name]
    monkeypatch.setattr(palette, "WIDE_FROM", 10**9)
    stub = type("Stub", (), {"dtypes": dtypes})()
    for bid in bug.boundaries:
        for d in DTYPES:
            if d in dtypes and sweep._runs_here(stub, branch_case(BY_ID[bid], bug.family, d)):
                if not (name == "fa_alibi_lse_no_bias" and d == "float64"):   # no lse in float64 there
                    return bid, d
    raise AssertionError(f"{name}: no boundary of its own in a dtype that shows it")


def _k(dtype: str) -> str:
    return f"test_each_boundary_in_each_family and {dtype}" + (" and not bfloat16" if dtype == "float16" else "")


def _extra(name: str) -> tuple[str, ...]:
    conv = "sdpa" if name == "sdpa_branch_control" else branch_bugs.BUGS[name].convention
    return () if conv in ("sdpa", "numpy") else (f"--convention={conv}",)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_sweep_catches_bug_at_its_branch_point(name, tmp_path, monkeypatch, record_property):
    bug = branch_bugs.BUGS[name]
    a = adapter(name)
    bid, dtype = cell_dtype(name, tuple(a.dtypes), monkeypatch)
    run = run_suite("numpy" if bug.convention == "numpy" else "torch", tmp_path / "run.json",
                    kernel=f"tests.kernels.branch_bugs:{name}", stop_at_first=True,
                    extra=("-k", _k(dtype), *_extra(name)), timeout_s=600)
    assert run.report is not None, run.output_tail
    f = run.first_failure or {}
    assert run.returncode == 1 and f, f"the sweep did not catch {name} in {dtype}:\n{run.output_tail}"
    where = AT.search(str(f.get("message")))
    assert where and where.group(1) in bug.boundaries, f"{name}: caught at {where and where.group(0)}, not at " \
                                                        f"one of {bug.boundaries}:\n{f.get('message')}"
    record_property("seconds", round(run.wall_s, 1))
    print(f"{name}: caught at {where.group(1)} / {where.group(2)} in {dtype}, {run.wall_s:.1f} s wall")


@pytest.mark.slow
def test_sweep_passes_the_sdpa_control(tmp_path):
    run = run_suite("torch", tmp_path / "run.json", kernel="tests.kernels.branch_bugs:sdpa_branch_control",
                    extra=("-k", "test_each_boundary_in_each_family"), timeout_s=600)
    assert run.report is not None, run.output_tail
    assert run.first_failure is None and run.returncode in (0, 2) and \
        run.report["verdict"]["verdict"] != "NONCONFORMANT", f"{run.first_failure}\n{run.output_tail}"
