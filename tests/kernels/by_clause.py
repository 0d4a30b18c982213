"""The clause-by-clause proof: which catalogue kernels violate each clause, and how to make the suite say so.

Each catalogue module registers its one-defect kernels in a `BUGS` dict and each kernel names the clause
its defect violates in its `.clause` attribute; that attribute is the only declaration of the fact. This
module gathers them (`kernels_by_clause`) and finds the conformance tests that cite a clause
(`tests_citing`), so a proof run can restrict the suite to those tests: the first failure of such a run is
then, by construction, a failure the suite reports under a test that states the kernel's clause.

The torch catalogues (buggy, flash_buggy) load only where torch is installed; the NumPy ones always do.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# catalogue module -> (backend it runs on, whether it needs torch); a kernel's convention comes from itself
CATALOGUES = {"clause_bugs": ("numpy", False), "variant_bugs": ("numpy", False), "buggy": ("torch", True),
              "flash_buggy": ("torch", True), "kernels2026_a": ("torch", True), "kernels2026_b": ("torch", True),
              "poison_bugs": ("torch", True), "determinism_bugs": ("torch", True)}


@dataclass(frozen=True)
class Kernel:
    """One catalogue kernel: where it lives, the clause it violates, and how the suite is pointed at it."""

    module: str
    name: str
    clause: str
    backend: str
    convention: str | None

    @property
    def spec(self) -> str:
        return f"tests.kernels.{self.module}:{self.name}"

    def suite_args(self) -> tuple[str, ...]:
        """The extra `pytest conformance` arguments this kernel needs (its convention, if not the default)."""
        return (f"--convention={self.convention}",) if self.convention else ()


def available() -> list[str]:
    """The catalogue modules this interpreter can import."""
    torch = importlib.util.find_spec("torch") is not None
    return [m for m, (_, needs_torch) in CATALOGUES.items() if torch or not needs_torch]


@cache
def kernels() -> tuple[Kernel, ...]:
    """Every one-defect kernel of the importable catalogues, in catalogue order."""
    out = []
    for module in available():
        mod = importlib.import_module(f"tests.kernels.{module}")
        for name, fn in mod.BUGS.items():
            fn = getattr(mod, name)                          # a catalogue may map names to (convention, clause)
            out.append(Kernel(module, name, fn.clause, CATALOGUES[module][0], getattr(fn, "convention", None)))
    return tuple(out)


def kernels_by_clause() -> dict[str, list[Kernel]]:
    """Clause id -> the catalogue kernels whose defect violates it (NumPy catalogues first: cheapest to run)."""
    out: dict[str, list[Kernel]] = {}
    for k in kernels():
        out.setdefault(k.clause, []).append(k)
    return out


def _cited(node: ast.AST) -> list[str]:
    """The clause ids of every `clauses(...)` call inside `node`."""
    return [arg.value for call in ast.walk(node) if isinstance(call, ast.Call) and getattr(call.func, "id", None)
            == "clauses" for arg in call.args if isinstance(arg, ast.Constant)]


@cache
def tests_citing() -> dict[str, tuple[tuple[str, str], ...]]:
    """Clause id -> (conformance test file name, test function) of every test whose @clauses cites it, the
    tests a factory makes (`test_x = _probe(...)`, the factory calling clauses) included."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        factories = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                if node.name.startswith("test_"):
                    cited = [c for deco in node.decorator_list for c in _cited(deco)]
                    for c in cited:
                        out.setdefault(c, []).append((path.name, node.name))
                else:
                    factories[node.name] = _cited(node)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("test_")]
                for c in factories.get(getattr(node.value.func, "id", None), []) if names else []:
                    out.setdefault(c, []).extend((path.name, n) for n in names)
    return {c: tuple(v) for c, v in out.items()}


def selection(clause: str) -> str:
    """A `pytest -k` expression that selects exactly the conformance tests citing `clause`."""
    tests = tests_citing().get(clause, ())
    if not tests:
        raise ValueError(f"no conformance test cites {clause}")
    return " or ".join(f"({file} and {fn})" for file, fn in tests)


def witness(clause: str) -> Kernel | None:
    """The kernel a proof run uses for `clause`: the first registered (NumPy catalogues before torch)."""
    ks = kernels_by_clause().get(clause)
    return ks[0] if ks else None
