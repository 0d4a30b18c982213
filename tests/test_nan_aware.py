"""NaN or inf where the reference is finite fails in every test (issue 25, item 4).

Two halves: the suite's own distance (conformance/engine/nan_aware.py) reads a NaN against a finite value as
infinitely far, and no module of the project calls a NaN-ignoring reduction (np.nanmax and friends,
np.fmax / np.fmin, which drop a NaN against a number), found by reading every source file's syntax tree.
An entry of ALLOWED names a call that is not a comparison, with the reason.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from attnconf.conformance.engine.nan_aware import gap, max_abs, max_gap

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("conformance", "adapters", "reference")
NAN_IGNORING = frozenset({
    "nanmax", "nanmin", "nansum", "nanmean", "nanmedian", "nanstd", "nanvar", "nanprod", "nanargmax",
    "nanargmin", "nanpercentile", "nanquantile", "nancumsum", "nancumprod", "fmax", "fmin"})
# (path relative to the root, enclosing function, name) -> why it is not a comparison
ALLOWED: dict[tuple[str, str, str], str] = {
    # findings' stand-alone reproductions (they import nothing of attnconf and judge nothing): each prints the
    # NaN count first and then the largest error of the finite outputs, a description, not a comparison
    ("adapters/onnx/findings/ONNX-ORT-ATTN-F16-SOFTCAP-OVERFLOW.py", "<module>", "nanmax"):
        "prints the finite outputs' largest error beside the count of NaN outputs",
    ("adapters/transformers/findings/TRANSFORMERS-EAGER-F16-LOGIT-OVERFLOW.py", "main", "nanmax"):
        "prints the finite outputs' largest error beside the count of NaN outputs",
}


def nan_ignoring_calls(source: str, filename: str = "<src>") -> list[tuple[str, int, str]]:
    """(enclosing function, line, name) of every use of a NaN-ignoring function in `source`: a call
    `np.nanmax(...)`, a method `.reduce` of one (`np.fmax.reduce`), or the name bare after an import."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.Attribute) and child.attr in NAN_IGNORING:
                found.append((func, child.lineno, child.attr))
            elif isinstance(child, ast.Name) and child.id in NAN_IGNORING:
                found.append((func, child.lineno, child.id))
            elif isinstance(child, ast.alias) and child.name.rpartition(".")[2] in NAN_IGNORING:
                found.append((func, getattr(child, "lineno", 0), child.name))
            visit(child, name)

    visit(ast.parse(source, filename), "<module>")
    return found


def test_scanner_finds_each_form():
    src = ("import numpy as np\nfrom numpy import nanmin\n"
           "def f(a, b):\n    x = np.nanmax(a)\n    y = np.fmax.reduce(b)\n    return torch.nansum(a) + nanmin(b)\n")
    names = sorted(n for _, _, n in nan_ignoring_calls(src))
    assert names == ["fmax", "nanmax", "nanmin", "nanmin", "nansum"]
    assert {f for f, _, n in nan_ignoring_calls(src) if n == "nanmax"} == {"f"}
    assert nan_ignoring_calls("import numpy as np\nx = np.maximum(np.max(a), 0)\n") == []


def test_project_uses_no_nan_ignoring_reduction():
    """conformance/, adapters/, reference/: each use is a defect unless ALLOWED says why it compares nothing."""
    hits, seen = [], set()
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for func, line, name in nan_ignoring_calls(path.read_text(encoding="utf-8"), rel):
                key = (rel, func, name.rpartition(".")[2])
                if key in ALLOWED:
                    seen.add(key)
                else:
                    hits.append(f"{rel}:{line} {name} in {func}")
    assert not hits, "NaN-ignoring reductions (use conformance/engine/nan_aware.py): " + "; ".join(hits)
    assert seen == set(ALLOWED), f"stale ALLOWED entries: {sorted(set(ALLOWED) - seen)}"


def test_gap_reads_nan_against_a_number_as_infinitely_far():
    a = np.array([1.0, np.nan, np.nan, np.inf, -np.inf, np.inf, 2.0])
    b = np.array([1.5, 0.0, np.nan, np.inf, -np.inf, -np.inf, np.inf])
    assert list(gap(a, b)) == [0.5, np.inf, 0.0, 0.0, 0.0, np.inf, np.inf]
    assert max_gap(a, b) == np.inf
    assert max_gap(a[:1], b[:1]) == 0.5
    assert max_gap(np.zeros(0), np.zeros(0)) == 0.0
    rows = max_gap(np.array([[1.0, np.nan], [1.0, 2.0]]), np.array([[1.0, 2.0], [1.0, 2.5]]), axis=-1)
    assert list(rows) == [np.inf, 0.5]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_max_abs_is_inf_on_a_non_finite_entry(bad):
    assert max_abs(np.array([1.0, bad, -3.0])) == np.inf
    assert max_abs(np.array([1.0, -3.0])) == 3.0
    assert max_abs(np.zeros((0, 2))) == 0.0
