"""Cells and the coverage floor: from the records of a run to one status per (implementation, clause, dtype).

A *cell* is one (implementation, clause, dtype): the examples that checked that clause at that
dtype, with their own status. Cells come from the records of the test items (one item per test x
implementation x dtype, `harness.for_cases`), and from the *plan* (plan.py), the tests the suite has,
so that a clause whose tests did not run (deselected, stopped by --run-timeout) shows as a cell that
was not run rather than disappearing.

    failing      a test failed on this clause at this dtype (the first failing case is kept)
    divergent    a declared divergence covered elements here, and they behaved as documented
    conformant   at least `floor` examples that exercise the clause's subject checked it here, none failed
    below_floor  fewer examples than the floor checked it
    unsupported  the implementation declared every example here out of its scope, or the clause's subject
                 (spec/clauses.toml: mask, bias, padding, GQA, gradients, ...) lies outside its declared scope
    not_run      no test of this clause ran here

The floor is spec/coverage's `min_examples`; a cell of a test that runs fixed cases rather than one dtype
(dtype `any`) needs one. verdict.py turns the cells into the run's verdict.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from attnconf.spec.vocabulary import ANY_DTYPE as ANY
from attnconf.spec.vocabulary import FAILING

from attnconf.conformance.engine.plan import PlannedTest


def floor() -> int:
    """The coverage floor: the examples a cell needs to be conformant (spec, `min_examples`)."""
    from attnconf import spec

    return spec.coverage()["min_examples"]


def kind(adapter: Any) -> str:
    """Which fixture an implementation is tested through: "layer" (a whole attention layer) or "sdpa"."""
    return "layer" if getattr(adapter, "kind", "sdpa") == "layer" else "sdpa"


def implementations(adapters: list) -> dict[str, dict[str, Any]]:
    """What `build_cells` needs to know of each implementation: its kind, dtypes and declared features."""
    return {a.name: {"kind": kind(a), "dtypes": list(getattr(a, "dtypes", ())),
                     "features": sorted(getattr(a, "capabilities", ()))} for a in adapters}


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


