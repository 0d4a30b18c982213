"""Render the report model as one self-contained HTML page (no external resources).

Every string from a run file passes through `e()` (html.escape with quotes). A Content-Security-
Policy forbids scripts and remote loads as a second line of defence: the page needs neither.
"""

from __future__ import annotations

import html
import re
from typing import Any

from attnconf.reports.merge import Cell, Report, environment_rows, format_ratio
from attnconf.spec.vocabulary import ANY_DTYPE
from attnconf.reports.plots import ratio_plots

SYMBOLS = {"conformant": "✓", "divergent": "◐", "unsupported": "–", "failing": "✗", "below_floor": "◔",
           "not_run": "·", None: ""}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1400px;
 padding:16px 24px;color:#1d232a;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d8dde3}
h3{font-size:15px;margin:18px 0 6px}nav a{margin-right:12px}
table{border-collapse:collapse;margin:6px 0 10px}th,td{border:1px solid #d8dde3;padding:3px 7px;
 text-align:left;vertical-align:top}th{background:#f3f5f7;font-weight:600}
td.group{background:#eef1f4;font-weight:600}
.hm td.cell{min-width:84px;text-align:center;padding:0}.hm td.cell summary{padding:3px 6px;cursor:pointer;
 list-style:none}.hm td.cell summary::-webkit-details-marker{display:none}
.conformant{background:#c9ecd2}.divergent{background:#fbe3a6}.unsupported{background:#e4e6e9;color:#555}
.failing{background:#f6b8b8}.notrun,.not_run{background:#fff;color:#aaa}.below_floor{background:#dfe8f6}
.drill{text-align:left;background:#fff;border-top:1px solid #ccc;padding:6px;min-width:340px;
 max-width:560px;font-size:12px}.drill .rec{margin:0 0 8px}.drill div{white-space:pre-wrap}.drill code,pre{white-space:pre-wrap;
 word-break:break-all;background:#f3f5f7;padding:1px 3px}
.badge{padding:1px 7px;border-radius:9px;font-weight:600;font-size:12px}
.CONFORMANT{background:#c9ecd2}.CONFORMANT_WITH_DIVERGENCES{background:#fbe3a6}.NONCONFORMANT{background:#f6b8b8}
.INCOMPLETE{background:#dfe8f6}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #ccc}
.small{font-size:12px;color:#555}img{max-width:100%;border:1px solid #d8dde3}
:target{outline:3px solid #3b7ddd}
"""


def e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def anchor(div_id: str) -> str:
    return "div-" + re.sub(r"[^A-Za-z0-9_-]", "_", str(div_id))


def div_link(div_id: str) -> str:
    return f'<a href="#{e(anchor(div_id))}">{e(div_id)}</a>'


def _record_html(rec: dict[str, Any]) -> str:
    parts = [f'<div class="rec"><b>{e(rec["status"])}</b> <code>{e(rec["nodeid"])}</code>']
    counts = [f"{rec[k]} {label}" for k, label in (("examples", "examples"),
              ("examples_unsupported", "unsupported"), ("examples_divergent", "divergent")) if rec.get(k)]
    if counts:
        parts.append(f'<div class="small">{e(", ".join(counts))}; run {e(rec.get("run_id", ""))}</div>')
    if rec.get("divergences"):
        parts.append("<div>divergences: " + ", ".join(div_link(d) for d in rec["divergences"]) + "</div>")
    ratios = rec.get("ratios") or {}
    if ratios:
        parts.append("<div>ratios: " + e(", ".join(f"{dt} {format_ratio(r.get('max'))}" for dt, r in ratios.items())) + "</div>")
    for key in ("message", "case"):
        if rec.get(key):
            parts.append(f"<div>{key}: {e(rec[key])}</div>")
    if rec.get("replay"):
        parts.append(f"<div>replay: <code>{e(rec['replay'])}</code></div>")
    if rec.get("failure_file"):
        parts.append(f"<div>failure file: <code>{e(rec['failure_file'])}</code></div>")
    if rec.get("unsupported_reasons"):
        parts.append("<div>unsupported: " + e("; ".join(rec["unsupported_reasons"])) + "</div>")
    return "".join(parts) + "</div>"


def _short_record_html(rec: dict[str, Any]) -> str:
    return f'<div class="small">{e(rec["status"])} <code>{e(rec["nodeid"])}</code></div>'


def _cell_html(cell: Cell | None, drill: bool = True) -> str:
    """A matrix cell; with drill, a <details> holding the failing and divergent records in full
    and the others as one line each."""
    if cell is None or cell.state is None:
        return '<td class="cell notrun">·</td>'
    label = SYMBOLS[cell.state]
    if cell.ratio is not None:
        label += " " + format_ratio(cell.ratio)
    if cell.checked:
        label += f" ({cell.checked})"
    label = e(label)
    if cell.state == "divergent" and cell.divergences:
        label += " " + " ".join(div_link(d) for d in cell.divergences)
    if not drill:
        return f'<td class="cell {cell.state}" title="{e(cell.state)}">{label}</td>'
    notable = cell.notable_records
    body = "".join(_record_html(r) for r in notable)
    body += "".join(_short_record_html(r) if r["status"] != "unsupported" else _record_html(r)
                    for r in cell.records if r not in notable)
    if cell.divergences:
        body = "<div>documented: " + ", ".join(div_link(d) for d in cell.divergences) + "</div>" + body
    if cell.first_failure:
        f = cell.first_failure
        body = (f"<div><b>first failure</b>: {e(f.get('message') or '')}<br>case: {e(f.get('case') or '')}<br>"
                f"replay: <code>{e(f.get('replay') or '')}</code></div>") + body
    return (f'<td class="cell {cell.state}" title="{e(cell.state)}"><details><summary>{label}</summary>'
            f'<div class="drill">{body}</div></details></td>')


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def heatmap(report: Report) -> str:
    impls = report.impls
    head = "<th>clause</th>" + "".join(f"<th>{e(i.implementation)}<br><span class=small>{e(i.device)}</span></th>" for i in impls)
    rows = []
    for group, clauses in report.groups:
        if not any((c.id, i) in report.impl_cells for c in clauses for i in impls):
            continue
        rows.append(f'<tr><td class="group" colspan="{len(impls) + 1}">{e(group)}</td></tr>')
        for clause in clauses:
            cells = [report.impl_cells.get((clause.id, i)) for i in impls]
            if not any(cells):
                continue
            title = f'<td title="{e(clause.statement)}"><b>{e(clause.id)}</b> {e(clause.title)}</td>'
            rows.append("<tr>" + title + "".join(_cell_html(c) for c in cells) + "</tr>")
    return f'<table class="hm"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def dtype_matrix(report: Report) -> str:
    out = []
    backends: dict[str, list] = {}
    for col in report.columns:
        backends.setdefault(report.backend_of(col.impl), []).append(col)
    for backend, cols in backends.items():
        head = "<th>clause</th>" + "".join(
            f"<th>{e(c.impl.implementation)}<br><span class=small>{e(c.impl.device)} · "
            f"{e(c.dtype if c.dtype != ANY_DTYPE else 'all dtypes')}</span></th>" for c in cols)
        rows = []
        for clause in report.clauses:
            cells = [report.cells.get((clause.id, c)) for c in cols]
            if any(cells):
                rows.append(f"<tr><td><b>{e(clause.id)}</b> {e(clause.title)}</td>"
                            + "".join(_cell_html(c, drill=False) for c in cells) + "</tr>")
        out.append(f'<h3>{e(backend)}</h3><table class="hm"><thead><tr>{head}</tr></thead>'
                   f'<tbody>{"".join(rows)}</tbody></table>')
    return "".join(out)


def render(report: Report) -> str:
    sec: list[str] = []
    from attnconf.reports.markdown import scope_text

    rows = []
    for run in report.runs:
        env, verdict = run["environment"], run["verdict"]
        v = verdict["verdict"]
        notes = "; ".join(verdict.get("incomplete_reasons") or [])
        if verdict.get("stale"):
            notes = (notes + "; " if notes else "") + "stale entries: " + ", ".join(verdict["stale"])
        rows.append([e(run["run_id"]), e(env["backend"]), e(env["device"]), e(env.get("device_name") or ""),
                     e(env.get("kernel") or ""), f'<span class="badge {e(v)}">{e(v)}</span>',
                     ", ".join(div_link(d) for d in verdict.get("divergences") or []),
                     e(", ".join(verdict.get("failed_clauses") or [])), e(notes),
                     f'<span class="small">{e(scope_text(run))}</span>'])
    sec.append('<h2 id="verdicts">Verdicts</h2>' + _table(
        ["run", "backend", "device", "device name", "kernel", "verdict", "divergences", "failed clauses", "notes",
         "scope"], rows))

    legend = ('<p class="legend"><span class="conformant">✓ conformant</span><span class="divergent">◐ divergent as '
              'documented</span><span class="unsupported">– outside the declared scope</span><span class="failing">'
              '✗ failing</span><span class="below_floor">◔ below the coverage floor</span><span class="notrun">· not '
              'run</span> The first number is the worst error ratio e_kernel / e_base (a pass needs e_kernel ≤ 2 e_base'
              ' + a rounding floor, spec §12), the one in parentheses how many examples checked the cell. Click a '
              'cell for its records.</p>')
    sec.append('<h2 id="heatmap">Clauses × implementations</h2>' + legend + heatmap(report))
    sec.append('<h2 id="matrix">Clauses × implementation × dtype</h2><p class="small">The same records split by '
               'dtype; the cells above hold the drill-down.</p>' + dtype_matrix(report))

    if report.pairs:
        prow = [[e(p.a.label), e(p.b.label), f"{p.agree}/{p.total}",
                 f'<span class="badge {"CONFORMANT" if p.agrees else "NONCONFORMANT"}">'
                 f'{"agree" if p.agrees else ("no shared case" if not p.total else "disagree")}</span>',
                 "<br>".join(f"{e(d['case'])} ({e(d['description'])}): {e(d['detail'])}" for d in p.disagreements)]
                for p in report.pairs]
        pairs = _table(["implementation A", "implementation B", "agree/total", "", "disagreeing cases"], prow)
    else:
        pairs = "<p>No two implementations ran the agreement panel.</p>"
    sec.append('<h2 id="agreement">Pairwise agreement on the panel</h2><p class="small">Agree on a case iff '
               'max|A − B| ≤ allowance A + allowance B; NaN agrees only with NaN at the same positions.</p>' + pairs)

    plots = ratio_plots(report.samples)
    imgs = "".join(
        f'<h3>{e(title)}</h3><img alt="{e(title)}" src="data:image/png;base64,{png}">'
        + (f'<p class="small">{skipped} non-finite point(s) not drawn.</p>' if skipped else "")
        for title, png, skipped in plots)
    sec.append('<h2 id="plots">Error ratio vs size</h2>' + (imgs or "<p>No samples recorded.</p>"))

    items = []
    for d in report.divergences:
        link = d.get("link")
        href = f' (<a href="{e(link)}">{e(link)}</a>)' if isinstance(link, str) and link.startswith("https://") else ""
        runs = "; ".join(f"{r['run_id']}: " + (f"observed={r['observed']}, witness: {r['witness']}" if r.get("holds", True)
                                                else f"inactive ({r.get('condition', '')})") for r in d.get("runs", []))
        bound = f", bound {d['bound']:g}" if d.get("bound") is not None else ""
        cond = ", ".join(f"{k}={v}" for k, v in (d.get("when") or {}).items()) or "always"
        items.append(f'<li id="{e(anchor(d["id"]))}"><b>{e(d["id"])}</b> — {e(d.get("clause", ""))} '
                     f'{e(d.get("kind", ""))}, region <code>{e(d.get("region", ""))}</code>, instead '
                     f'<code>{e(d.get("instead", ""))}</code>{e(bound)} on {e(", ".join(d.get("quantities") or []))}'
                     f' (dtypes {e(", ".join(d.get("dtypes") or []) or "all")}; holds where: {e(cond)}): '
                     f'{e(d.get("reason", ""))}{href}<div class="small">{e(d.get("measured", ""))} {e(runs)}</div></li>')
    sec.append('<h2 id="divergences">Divergences</h2><p class="small">Each entry exempts only the elements of its '
               'region; those are checked against what it declares instead.</p>'
               + (f"<ul>{''.join(items)}</ul>" if items else "<p>None.</p>"))
    from attnconf.reports.markdown import findings

    frows = [[e(f.id), e(f.fields.get("target", "")), e(", ".join(f.clauses)), e(f.status), e(f.title),
              f'<a href="findings/{e(f.id)}.md">write-up</a>, <a href="findings/{e(f.id)}.py">reproduction</a>']
             for f in findings()]
    sec.append('<h2 id="findings">Findings</h2><p class="small">Real defects found in implementations nobody here '
               'wrote; each has a self-contained reproduction that a test runs.</p>'
               + (_table(["id", "target", "clause", "status", "finding", "files"], frows) if frows else "<p>None yet.</p>"))

    orows = [[e(o["clause"]), e(o["key"]), e(f"{o.get('implementation')} ({o['device']})"), e(o["value"]),
              e(o.get("case") or "")] for o in report.observations]
    sec.append('<h2 id="observations">Observations (recorded, not pass/fail)</h2>'
               + (_table(["clause", "observation", "implementation", "value", "case"], orows) if orows else "<p>None.</p>"))

    envs = "".join(f"<h3>{e(run['run_id'])}</h3>" + _table(["", ""], [[e(k), e(v)] for k, v in environment_rows(run)])
                   for run in report.runs)
    sec.append('<h2 id="environments">Environments</h2>' + envs)

    nav = " ".join(f'<a href="#{a}">{t}</a>' for a, t in (
        ("verdicts", "verdicts"), ("heatmap", "heatmap"), ("matrix", "by dtype"), ("agreement", "agreement"),
        ("plots", "plots"), ("divergences", "divergences"), ("findings", "findings"), ("observations", "observations"),
        ("environments", "environments")))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>attnconf conformance report</title><style>{CSS}</style></head><body>"
        f"<h1>attnconf conformance report</h1><p class=\"small\">{len(report.runs)} run(s)</p><nav>{nav}</nav>"
        + "".join(sec) + "</body></html>\n"
    )
