"""From records to cells to one verdict (SPEC §16).

A *cell* is one (implementation, clause, dtype): the examples that checked that clause at that
dtype, with their own status. Cells come from the records of the test items (one item per test x
implementation x dtype, `harness.for_cases`), and from the *plan*, the tests the suite has, so
that a clause whose tests did not run (deselected, stopped by --run-timeout) shows as a cell that
was not run rather than disappearing.

    failing      a test failed on this clause at this dtype (the first failing case is kept)
    divergent    a declared divergence covered elements here, and they behaved as documented
    conformant   at least `floor` examples that exercise the clause's subject checked it here, none failed
    below_floor  fewer examples than the floor checked it
    unsupported  the implementation declared every example here out of its scope, or the clause's subject
                 (spec/clauses.toml: mask, bias, padding, GQA, gradients, ...) lies outside its declared scope
    not_run      no test of this clause ran here

The verdict is NONCONFORMANT if any cell fails; otherwise INCOMPLETE if the run was cut short, ran
nothing, or left an in-scope cell below the floor or not run; otherwise CONFORMANT_WITH_DIVERGENCES
if some cell is divergent; otherwise CONFORMANT. Stale divergence entries are listed, and never
change a verdict.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Any

FAILING = ("fail", "error", "crashed", "timeout")
ANY = "any"                     # the dtype of tests that run fixed cases rather than one dtype cell
VERDICTS = ("CONFORMANT", "CONFORMANT_WITH_DIVERGENCES", "NONCONFORMANT", "INCOMPLETE")


@dataclass
class PlannedTest:
    test: str
    fixture: str                 # "impl" (SDPA-style implementations) or "layer_impl"
    clauses: tuple[str, ...]
    dtypes: tuple[str, ...] | None   # None: not split into dtype cells
    opt_in: bool = False         # runs only when asked for (--long, --measure-memory)
    needs: tuple[str, ...] = ()  # features the property is about ("a|b": either); harness.for_cases
    shares_floor: bool = True    # others citing its clauses may draw fewer on its account (harness.cell_minimum)


def plan() -> list[PlannedTest]:
    """Every test of the suite, read from the conformance test modules' declarations."""
    import attnconf.conformance as pkg

    out = []
    loaded = _loaded_by_file()
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("test_"):
            continue
        module = loaded.get(os.path.join(os.path.realpath(info.module_finder.path), f"{info.name}.py")) \
            or importlib.import_module(f"attnconf.conformance.{info.name}")
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
                continue
            marks = getattr(fn, "pytestmark", [])
            ids = tuple(c for m in marks if m.name == "clauses" for c in m.args)
            if not ids:
                continue
            fixture = getattr(fn, "attnconf_fixture", None)
            if fixture is None:
                params = inspect.signature(fn).parameters
                fixture = "layer_impl" if "layer_impl" in params else "impl" if "impl" in params else None
            if fixture is None:
                continue
            opt_in = any(m.name == "attnconf_opt_in" for m in marks)
            out.append(PlannedTest(name, fixture, ids, getattr(fn, "attnconf_dtypes", None), opt_in,
                                   tuple(getattr(fn, "attnconf_needs", ())),
                                   getattr(fn, "attnconf_shares_floor", True)))
    return out


@functools.cache
def subjects() -> dict[str, tuple[str, ...]]:
    """Clause id -> its subject (spec/clauses.toml `subject`): the features an example must exercise to
    count for the clause, each item "a|b" held by either."""
    from attnconf import spec

    return {cid: tuple(c["subject"]) for cid, c in spec.clauses().items() if c.get("subject")}


def _holds(subject: tuple[str, ...], features: set[str] | frozenset[str]) -> bool:
    return all(set(item.split("|")) & features for item in subject)


def credited(record: dict[str, Any], subject: tuple[str, ...] | None) -> int:
    """The examples of a record that count for a clause with this subject: its judged examples minus those
    whose features (`checked_features`, "+"-joined feature sets -> count, kept by harness.run) lack the
    subject. Examples judged without a recorded feature set (another path, an older run file) still count."""
    n = record.get("examples_checked", 0)
    if not subject:
        return n
    for sig, k in (record.get("checked_features") or {}).items():
        if not _holds(subject, set(filter(None, sig.split("+")))):
            n -= k
    return max(n, 0)


def out_of_scope(subject: tuple[str, ...] | None, info: dict[str, Any]) -> bool:
    """An SDPA implementation whose declared features lack every feature of some item of the subject has the
    clause out of its scope: no example can credit it, and its cell is out of scope, not unchecked."""
    if not subject or info.get("kind") == "layer" or info.get("features") is None:
        return False
    return not _holds(subject, set(info["features"]))


def _loaded_by_file() -> dict[str, Any]:
    """Modules already imported, by the real path of their file. In a checkout pytest imports the suite's
    test modules as `conformance.test_*`: `plan` reads those rather than importing each file a second time
    as `attnconf.conformance.test_*` (which built every pinned case again: 3.4 of the 24 s of a profiled -x
    run, measured under load)."""
    out = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.basename(path).startswith("test_"):
            out[os.path.realpath(path)] = module
    return out


@dataclass
class Cell:
    implementation: str
    clause: str
    dtype: str
    checked: int = 0
    divergent: int = 0
    unsupported: int = 0
    failed: int = 0
    not_run: int = 0
    tests: set[str] = field(default_factory=set)
    divergences: set[str] = field(default_factory=set)
    first_failure: dict[str, Any] | None = None
    unsupported_reasons: set[str] = field(default_factory=set)
    out_of_scope: bool = False          # the clause's subject is outside the declared scope (`out_of_scope`)

    def status(self, floor: int) -> str:
        if self.failed:
            return "failing"
        if self.divergent:
            return "divergent"
        if self.out_of_scope:
            return "unsupported"
        judged = self.checked
        if judged >= (1 if self.dtype == ANY else floor):
            return "conformant"
        if judged > 0:
            return "below_floor"
        if self.unsupported:
            return "unsupported"
        return "not_run"

    def as_dict(self, floor: int) -> dict[str, Any]:
        return {"implementation": self.implementation, "clause": self.clause, "dtype": self.dtype,
                "status": self.status(floor), "checked": self.checked, "divergent": self.divergent,
                "unsupported": self.unsupported, "failed": self.failed, "not_run": self.not_run,
                "tests": sorted(self.tests), "divergences": sorted(self.divergences),
                "first_failure": self.first_failure,
                "unsupported_reasons": sorted(self.unsupported_reasons)[:5]}


def build_cells(records: list[dict[str, Any]], impls: dict[str, dict[str, Any]], planned: list[PlannedTest],
                entries: dict[str, dict[str, Any]]) -> dict[tuple[str, str, str], Cell]:
    """Cells from the records, plus a not-run cell for every planned (test, clause, dtype) of each
    implementation that no record covers. `impls` maps implementation name -> {"kind", "dtypes"} and, where
    known, "features" (its declared capabilities): a clause whose subject lies outside them is out of scope.
    A record's examples count for a clause only where they exercise its subject (`credited`)."""
    cells: dict[tuple[str, str, str], Cell] = {}
    subject = subjects()

    def cell(impl: str, clause: str, dtype: str) -> Cell:
        key = (impl, clause, dtype)
        if key not in cells:
            cells[key] = Cell(impl, clause, dtype,
                              out_of_scope=out_of_scope(subject.get(clause), impls.get(impl, {})))
        return cells[key]

    ran: set[tuple[str, str, str]] = set()
    for r in records:
        impl, dtype = r["implementation"], r.get("dtype") or ANY
        if impl == "-":
            continue
        ran.add((impl, r["test"], dtype))
        for c in r["clauses"]:
            x = cell(impl, c, dtype)
            x.tests.add(r["test"])
            if r["status"] == "not_run":
                x.not_run += 1
                continue
            if r["status"] == "not_requested":
                continue
            x.checked += credited(r, subject.get(c))
            x.unsupported += r.get("examples_unsupported", 0)
            x.unsupported_reasons.update(r.get("unsupported_reasons", []))
            if r["status"] == "unsupported" and not r.get("examples_unsupported"):
                x.unsupported += 1
        for eid, n in (r.get("divergent_by_entry") or {}).items():
            clause = entries.get(eid, {}).get("clause", "ATTN-OP-1")
            x = cell(impl, clause, dtype)
            x.divergent += n
            x.divergences.add(eid)
            x.tests.add(r["test"])
        if r["status"] in FAILING:
            x = cell(impl, r.get("failed_clause") or "ATTN-OP-1", dtype)
            x.failed += 1
            x.tests.add(r["test"])
            if x.first_failure is None:
                x.first_failure = {"test": r["test"], "nodeid": r["nodeid"], "status": r["status"],
                                   "message": r.get("message"), "case": r.get("case"), "replay": r.get("replay")}
    for impl, info in impls.items():
        for t in planned:
            if t.fixture != ("layer_impl" if info.get("kind") == "layer" else "impl") or t.opt_in:
                continue
            dtypes = [d for d in (t.dtypes or (ANY,)) if d == ANY or d in info.get("dtypes", ())]
            for d in dtypes:
                if (impl, t.test, d) not in ran:
                    for c in t.clauses:
                        x = cell(impl, c, d)
                        x.not_run += 1
                        x.tests.add(t.test)
    return cells


def decide(cells: dict[tuple[str, str, str], Cell], records: list[dict[str, Any]], *, floor: int,
           complete: bool, apply_floor: bool = True, stale: list[str] | None = None) -> dict[str, Any]:
    """The verdict, with the failed clauses (each with its first failing case), the divergences that
    applied, the cells that keep the run from a verdict (missing) and the stale entries."""
    statuses = {k: c.status(floor) for k, c in cells.items()}
    failing = [cells[k] for k, s in statuses.items() if s == "failing"]
    divergent = sorted({d for k, c in cells.items() if statuses[k] == "divergent" for d in c.divergences})
    judged = sum(c.checked + c.divergent for c in cells.values())
    missing = [cells[k] for k, s in statuses.items() if s in ("below_floor", "not_run")]
    reasons = []
    if not complete:
        reasons.append("the run was cut short (interrupted or --run-timeout)")
    if not records or judged == 0:
        reasons.append("no example was judged (empty selection, or nothing in scope)")
    if apply_floor and missing:
        reasons.append(f"{len(missing)} cell(s) below the coverage floor of {floor} example(s) or not run")
    if failing:
        v = "NONCONFORMANT"
    elif reasons:
        v = "INCOMPLETE"
    elif divergent:
        v = "CONFORMANT_WITH_DIVERGENCES"
    else:
        v = "CONFORMANT"
    failed = {}
    for c in sorted(failing, key=lambda c: (c.clause, c.dtype, c.implementation)):
        failed.setdefault(c.clause, {"clause": c.clause, "dtype": c.dtype, "implementation": c.implementation,
                                     **(c.first_failure or {})})
    return {"verdict": v, "divergences": divergent, "failed_clauses": sorted(failed),
            "failures": list(failed.values()), "incomplete_reasons": reasons if v == "INCOMPLETE" else [],
            "missing": [{"implementation": c.implementation, "clause": c.clause, "dtype": c.dtype,
                         "status": c.status(floor), "checked": c.checked} for c in missing] if apply_floor else [],
            "stale": sorted(stale or []), "floor": floor}


def verdict_line(v: dict[str, Any]) -> str:
    if v["verdict"] == "CONFORMANT_WITH_DIVERGENCES":
        return f"CONFORMANT_WITH_DIVERGENCES[{', '.join(v['divergences'])}]"
    if v["verdict"] == "NONCONFORMANT":
        return f"NONCONFORMANT (failed clauses: {', '.join(v['failed_clauses']) or 'none cited'})"
    if v["verdict"] == "INCOMPLETE":
        return f"INCOMPLETE ({'; '.join(v.get('incomplete_reasons') or []) or 'not enough was checked'})"
    return "CONFORMANT"
