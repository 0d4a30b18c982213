"""The attnconf section of pytest's terminal summary, read from the final run file.

Everything it prints is in the run file too; the summary only says it where the person who ran the
suite is looking: what failed and how to replay it, which divergences did not apply, and the verdict.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnconf.spec.vocabulary import FAILING

if TYPE_CHECKING:
    from attnconf.conformance.engine.run_state import RunState


def ratio_tail(records: list[dict[str, Any]], name: str) -> str:
    """'; worst error ratio float32 0.412, float16 inf' for one implementation: NaN and inf (non-finite output
    where the reference is finite) count as the worst, and 3 significant digits never print a 1.75e6 as 0.00."""
    from attnconf.conformance.engine.harness import worst

    out: dict[str, float] = {}
    for r in records:
        if r["implementation"] == name:
            for dt, v in (r.get("ratios") or {}).items():
                out[dt] = worst(out.get(dt, 0.0), float(v["max"]))
    if not out:
        return ""
    return "; worst error ratio " + ", ".join(f"{d} {v:.3g}" for d, v in sorted(out.items()))


def write_summary(terminalreporter: Any, state: RunState) -> None:
    """The attnconf section at the end of pytest's output: counts, cells per implementation, causes and
    failures with their replay commands, divergences that did not apply or went stale, and the verdict."""
    from attnconf.conformance.engine.verdict import verdict_line

    config = state.config
    run = state.run
    tr = terminalreporter
    tr.section("attnconf")
    counts: dict[str, int] = {}
    for r in run["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    tr.write_line(f"backend {state.session.backend} on {run['environment']['device']}: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    cells: dict[str, dict[str, int]] = {}
    for c in run["cells"]:
        cells.setdefault(c["implementation"], {}).setdefault(c["status"], 0)
        cells[c["implementation"]][c["status"]] += 1
    for name in sorted(cells):
        tail = ratio_tail(run["records"], name)
        tr.write_line(f"  {name}: clause x dtype cells " + ", ".join(f"{n} {s}" for s, n in sorted(cells[name].items()))
                      + tail)
    v = run["verdict"]
    from attnconf.reports.causes import cause_line

    for g in run.get("causes") or []:
        tr.write_line(f"  CAUSE {cause_line(g)}", red=g.get("declaration") is None, yellow=g.get("declaration") is not None)
        if g.get("replay"):
            tr.write_line(f"    replay: {g['replay']}")
    for f in v.get("failures", []):
        tr.write_line(f"  FAILED {f['clause']} ({f['implementation']}, {f['dtype']}): {f.get('message')}")
        if f.get("case"):
            tr.write_line(f"    case: {f['case']}")
        if f.get("replay"):
            tr.write_line(f"    replay: {f['replay']}")
    for r in run["records"]:
        if r["status"] in FAILING and r.get("failed_clause") is None:
            tr.write_line(f"  {r['status'].upper()} {r['nodeid']}: {r['message']}")
    for d in run["divergences"]:
        if d.get("declared"):
            from attnconf.conformance.engine.declared import sentence

            tr.write_line(f"  declared {sentence(d)}", red=bool(d.get("contradicted")))
            continue
        if not d["holds"]:
            tr.write_line(f"  divergence {d['id']} inactive here ({d['condition']}); witness: {d['witness_status']}")
        elif str(d["witness_status"]).startswith("stale"):
            tr.write_line(f"  STALE divergence {d['id']}: its witness conforms now ({d['witness_detail']}); "
                          f"remove or narrow the entry", yellow=True)
    missing = v.get("missing") or []
    if missing and v["verdict"] == "INCOMPLETE":
        shown = ", ".join(f"{m['implementation']} {m['clause']} {m['dtype']} ({m['status']}, {m['checked']})"
                          for m in missing[:12])
        tr.write_line(f"  cells missing the floor of {v['floor']} example(s): {shown}"
                      + (f" and {len(missing) - 12} more" if len(missing) > 12 else ""))
    tr.write_line(f"verdict: {verdict_line(v)}", bold=True)
    if config.getoption("--report"):
        tr.write_line(f"report: {config.getoption('--report')}")
