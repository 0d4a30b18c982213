"""Render the report model as GitHub-flavoured Markdown (README.md of the site, CI step summary).

Every string that came from a run file goes through `md()`: table pipes, newlines and angle
brackets are neutralised, so a kernel called `<script>` shows as text.
"""

from __future__ import annotations

from typing import Any

from attnconf.reports.merge import Report, environment_rows, format_ratio
from attnconf.spec.vocabulary import ANY_DTYPE, FAILING

SYMBOLS = {
    "conformant": "✅",
    "divergent": "⚠️",
    "unsupported": "➖",
    "failing": "❌",
    "below_floor": "◔",
    "not_run": "·",
    None: "",
}


def md(text: Any) -> str:
    """Escape run-file text for a Markdown table cell."""
    s = " ".join(str(text).split())
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`"), ("*", "\\*"), ("_", "\\_")):
        s = s.replace(a, b)
    return s


def code(text: Any) -> str:
    """Inline code for a run-file string (commands, node ids): no backticks can break out."""
    s = " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")
    return f"`{s}`"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def cell_text(state: str | None, ratio: float | None, divergences: list[str], checked: int | None = None) -> str:
    parts = [SYMBOLS[state]]
    if state == "divergent" and divergences:
        parts.append(", ".join(md(d) for d in divergences))
    if ratio is not None:
        parts.append(format_ratio(ratio))
    if checked and state in ("conformant", "below_floor", "divergent"):
        parts.append(f"({checked})")
    return " ".join(parts)


def matrix_lines(report: Report) -> list[str]:
    lines: list[str] = []
    backends: dict[str, list] = {}
    for col in report.columns:
        backends.setdefault(report.backend_of(col.impl), []).append(col)
    for backend, cols in backends.items():
        lines += ["", f"### {md(backend)}", ""]
        header = ["clause"] + [
            f"{md(c.impl.implementation)}<br>{md(c.impl.device)}<br>{md(c.dtype if c.dtype != ANY_DTYPE else 'all dtypes')}"
            for c in cols
        ]
        rows = []
        for group, clauses in report.groups:
            group_cells = [report.cells.get((cl.id, c)) for cl in clauses for c in cols]
            if not any(group_cells):
                continue
            rows.append([f"**{md(group)}**"] + [""] * len(cols))
            for clause in clauses:
                cells = [report.cells.get((clause.id, c)) for c in cols]
                if not any(cells):
                    continue
                row = [f"{md(clause.id)} {md(clause.title)}"]
                row += [cell_text(x.state, x.ratio, x.divergences, x.checked) if x else SYMBOLS[None] for x in cells]
                rows.append(row)
        lines += _table(header, rows)
    not_run = [c for c in report.clauses if not any(k[0] == c.id for k in report.impl_cells)]
    if not_run:
        lines += ["", "Clauses no run exercised: " + ", ".join(md(c.id) for c in not_run) + "."]
    return lines


def pairs_lines(report: Report) -> list[str]:
    if not report.pairs:
        return ["No two implementations ran the agreement panel."]
    rows = []
    for p in report.pairs:
        verdict = "agree" if p.agrees else ("no shared case" if p.total == 0 else "disagree")
        bad = "; ".join(f"{md(d['case'])}: {md(d['detail'])}" for d in p.disagreements)
        rows.append([md(p.a.label), md(p.b.label), f"{p.agree}/{p.total}", verdict, bad])
    return _table(["implementation A", "implementation B", "agree/total", "", "disagreeing cases"], rows)


def failure_lines(report: Report) -> list[str]:
    """Each failing record once, with what a developer needs to reproduce it."""
    out: list[str] = []
    for run in report.runs:
        for rec in run["records"]:
            if rec["status"] not in FAILING:
                continue
            out.append(f"- {md(rec['status'].upper())} {code(rec['nodeid'])} ({md(', '.join(rec['clauses']))}): "
                       f"{md(rec.get('message') or '')}")
            if rec.get("case"):
                out.append(f"  - case: {code(rec['case'])}")
            if rec.get("replay"):
                out.append(f"  - replay: {code(rec['replay'])}")
    return out or ["None."]


def scope_text(run: dict[str, Any]) -> str:
    from attnconf.adapters.scope import Scope

    return "; ".join(f"{name}: {Scope.from_record(scope).sentence()}"
                     for name, scope in (run["environment"].get("scopes") or {}).items())


def divergence_lines(report: Report) -> list[str]:
    if not report.divergences:
        return ["None."]
    rows = []
    for d in report.divergences:
        instead = str(d.get("instead", ""))
        if d.get("bound") is not None:
            instead += f" (bound {d['bound']:g})"
        if d.get("value") is not None:
            instead += f" (value {d['value']:g})"
        where = "; ".join(f"{r['run_id']}: " + (f"witness {r['witness']}" if r.get("holds", True)
                                                  else f"inactive ({r.get('condition', '')})")
                          for r in d.get("runs", []))
        cond = ", ".join(f"{k}={v}" for k, v in (d.get("when") or {}).items())
        rows.append([md(d["id"]), md(d.get("clause", "")), md(d.get("kind", "")), md(d.get("region", "")),
                     md(instead), md(", ".join(d.get("quantities") or [])), md(", ".join(d.get("dtypes") or []) or "all"),
                     md(cond or "always"), md(where), md(d.get("reason", "")), md(d.get("link") or "")])
    return _table(["id", "clause", "kind", "region", "instead", "quantities", "dtypes", "conditions",
                   "witness", "reason", "link"], rows)


def findings() -> list:
    """The findings' write-ups (reports/findings), or [] if they cannot be read (their own test says why)."""
    try:
        from attnconf.reports import findings_index

        return findings_index.load_all(validate_clauses=False)
    except Exception:
        return []


def findings_lines() -> list[str]:
    found = findings()
    if not found:
        return ["None yet."]
    rows = [[md(f.id), md(f.fields.get("target", "")), md(", ".join(f.clauses)), md(f.status), md(f.title),
             f"[write-up](findings/{f.id}.md), [reproduction](findings/{f.id}.py)"] for f in found]
    return _table(["id", "target", "clause", "status", "finding", "files"], rows)


def render(report: Report) -> str:
    lines = [
        "# attnconf conformance matrix",
        "",
        "Legend: ✅ conformant, ⚠️ divergent as documented (entry id), ➖ outside the declared scope, ❌ failing,"
        " ◔ fewer examples than the coverage floor, · not run. The first number is the worst error ratio"
        " e_kernel / e_base at that dtype (kernel error over the naive baseline's; a pass needs e_kernel <= 2 e_base"
        " + a rounding floor, spec §12); the number in parentheses is how many examples checked the cell.",
        "",
        "## Verdicts",
        "",
    ]
    rows = []
    for run in report.runs:
        env, verdict = run["environment"], run["verdict"]
        note = "; ".join(verdict.get("incomplete_reasons") or [])
        if verdict.get("stale"):
            note = (note + "; " if note else "") + "stale entries: " + ", ".join(verdict["stale"])
        rows.append([
            md(run["run_id"]), md(env["backend"]), md(env["device"]), md(env.get("kernel") or ""),
            f"**{md(verdict['verdict'])}**", md(", ".join(verdict.get("divergences") or [])),
            md(", ".join(verdict.get("failed_clauses") or [])), md(note), md(scope_text(run)),
        ])
    lines += _table(["run", "backend", "device", "kernel", "verdict", "divergences", "failed clauses", "notes",
                     "scope"], rows)
    lines += ["", "## Matrix"] + matrix_lines(report)
    lines += ["", "## Pairwise agreement on the panel", "",
              "Two implementations agree on a panel case when max|A - B| ≤ allowance A + allowance B"
              " (NaN only where the other has NaN).", ""]
    lines += pairs_lines(report)
    lines += ["", "## Failures", ""] + failure_lines(report)
    lines += ["", "## Divergences", "",
              "Each entry exempts only the elements of its region, and those elements are checked against what the"
              " entry declares instead (spec/divergences/README.md).", ""]
    lines += divergence_lines(report)
    lines += ["", "## Findings", "", "Real defects attnconf found in implementations nobody here wrote; each has a"
              " self-contained reproduction that a test runs.", ""]
    lines += findings_lines()
    lines += ["", "## Observations", ""]
    if report.observations:
        rows = [[md(o["clause"]), md(o["key"]), md(f"{o.get('implementation')} ({o['device']})"),
                 md(o["value"]), md(o.get("case") or "")] for o in report.observations]
        lines += _table(["clause", "observation", "implementation", "value", "case"], rows)
    else:
        lines.append("None recorded.")
    lines += ["", "## Environments"]
    for run in report.runs:
        lines += ["", f"### {md(run['run_id'])}", ""]
        lines += _table(["", ""], [[md(k), md(v)] for k, v in environment_rows(run)])
    return "\n".join(lines) + "\n"
