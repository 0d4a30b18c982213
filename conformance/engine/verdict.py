"""From cells to one verdict (SPEC §16).

The cells (cells.py: one status per implementation, clause and dtype) decide the run: the verdict is
NONCONFORMANT if any cell fails; otherwise INCOMPLETE if the run was cut short, ran nothing, or left an
in-scope cell below the floor or not run; otherwise CONFORMANT_WITH_DIVERGENCES if some cell is divergent;
otherwise CONFORMANT. Stale divergence entries are listed, and never change a verdict.

The names of cells.py and plan.py stay importable from here (`verdict.build_cells`, `verdict.plan`, ...).
"""
from __future__ import annotations

from typing import Any

from attnconf.spec.vocabulary import FAILING  # noqa: F401  (importable from here as before)

from attnconf.conformance.engine.cells import (  # noqa: F401  (the public face of the cells)
    ANY, Cell, build_cells, credited, out_of_scope, subjects)
from attnconf.conformance.engine.plan import PlannedTest, plan  # noqa: F401

VERDICTS = ("CONFORMANT", "CONFORMANT_WITH_DIVERGENCES", "NONCONFORMANT", "INCOMPLETE")


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
