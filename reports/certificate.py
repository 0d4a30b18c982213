"""Certificates: what one run of a third-party kernel established, as Markdown for a PR and JSON.

A certificate is derived only from the run file, so anyone can regenerate and check it. It states
the verdict, the scope the kernel declared ("certified for ...; not covered: ..."), every clause x
dtype cell with its status and counts, the divergences with what they declare instead and how
their witnesses behaved, and the failed clauses with their smallest case and replay command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnconf.reports import badge
from attnconf.reports.causes import cause_line
from attnconf.reports.markdown import md
from attnconf.adapters.scope import Scope
from attnconf.reports.merge import Clause, environment_rows, format_ratio, load_clauses, worst_ratio
from attnconf.reports.runfile import encode
from attnconf.spec.vocabulary import ANY_DTYPE, DTYPES

CERTIFICATE_VERSION = 2
def slug(run: dict[str, Any]) -> str:
    env = run["environment"]
    text = f"{env.get('kernel') or 'kernel'}-{env['backend']}-{env['device']}"
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "kernel"


def ratios_by_dtype(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in run["records"]:
        for dtype, stats in (rec.get("ratios") or {}).items():
            agg = out.setdefault(dtype, {"max": None, "cases": 0})
            agg["max"] = worst_ratio(agg["max"], stats.get("max"))
            agg["cases"] += int(stats.get("cases") or 0)
    return dict(sorted(out.items()))


def build(run: dict[str, Any], clauses: list[Clause] | None = None) -> dict[str, Any]:
    """The certificate as plain data (what the JSON file holds): the verdict, the declared scope, and
    every clause x dtype cell with its status and counts, from the run file alone."""
    clauses = clauses if clauses is not None else load_clauses()
    order = {c.id: i for i, c in enumerate(clauses)}
    env = run["environment"]
    cells = sorted(run.get("cells") or [], key=lambda c: (c["implementation"], order.get(c["clause"], 999),
                                                          c["dtype"]))
    scopes = {}
    for name, scope in (env.get("scopes") or {}).items():
        certified, missing = Scope.from_record(scope).words()
        scopes[name] = {"declared": scope, "certified_for": certified, "not_covered": missing}
    by_state: dict[str, list[str]] = {}
    for c in cells:
        by_state.setdefault(c["status"], [])
        key = f"{c['clause']}@{c['dtype']}"
        if key not in by_state[c["status"]]:
            by_state[c["status"]].append(key)
    return {
        "certificate_version": CERTIFICATE_VERSION,
        # a third-party kernel, or (attnconf certify --impl) the built-in implementations that ran
        "kernel": env.get("kernel") or ", ".join(env.get("implementations") or {}) or None,
        "convention": env.get("convention"),
        "run_id": run["run_id"],
        "created": run["created"],
        "complete": run.get("complete", True),
        "verdict": run["verdict"]["verdict"],
        "verdict_detail": run["verdict"],
        "scopes": scopes,
        "cells": cells,
        "cells_by_status": by_state,
        "causes": run.get("causes") or [],
        "divergences": [d for d in run.get("divergences") or [] if d.get("observed") or d.get("witness_status")],
        "ratios": ratios_by_dtype(run),
        "environment": env,
    }


def render_markdown(cert: dict[str, Any], clauses: list[Clause] | None = None) -> str:
    titles = {c.id: c.title for c in (clauses if clauses is not None else load_clauses())}
    env = cert["environment"]
    v = cert["verdict_detail"]
    lines = [
        f"## attnconf certificate: {md(cert['kernel'] or env['backend'])}",
        "",
        f"**Verdict: {md(cert['verdict'])}** on {md(env['backend'])} / {md(env['device'])}"
        f" ({md(env.get('device_name') or '')})" + (f", convention {md(cert['convention'])}" if cert.get("convention") else "")
        + f"; run {md(cert['run_id'])}, {md(cert['created'])}.",
        "",
    ]
    for name, s in cert["scopes"].items():
        lines += [f"- {md(name)}: certified for {md(s['certified_for'])}; not covered: {md(s['not_covered'])}."]
    lines += declared_lines(cert)
    if v.get("incomplete_reasons"):
        lines += ["", "**Why INCOMPLETE:** " + md("; ".join(v["incomplete_reasons"]))]
    if cert.get("causes"):
        lines += ["", "### Causes (one line per behaviour that explains failures)", ""]
        for g in cert["causes"]:
            decl = f"; documented behaviour? declare `{g['declaration']}`" if g.get("declaration") else ""
            lines.append(f"- {md(cause_line({**g, 'declaration': None}))}{decl}")
            if g.get("replay"):
                lines.append(f"  - case `{md(g.get('failure_file') or '')}`; replay: `{g['replay']}`")
    if v.get("failures"):
        lines += ["", "### Failed clauses", ""]
        for f in v["failures"]:
            lines.append(f"- **{md(f['clause'])}** ({md(titles.get(f['clause'], ''))}) at {md(f['dtype'])}, "
                         f"{md(f['implementation'])}: {md(f.get('message') or '')}")
            if f.get("case"):
                lines.append(f"  - smallest failing case: `{md(f['case'])}`")
            if f.get("replay"):
                lines.append(f"  - replay: `{f['replay']}`")
    lines += ["", "### Clause x dtype cells", "",
              "Status per cell (examples checked / covered by a divergence / out of scope); "
              f"the coverage floor is {v.get('floor', '?')} checked examples per cell.", ""]
    dtypes = [d for d in (*DTYPES, ANY_DTYPE) if any(c["dtype"] == d for c in cert["cells"])]
    impls = sorted({c["implementation"] for c in cert["cells"]})
    sym = {"conformant": "✅", "divergent": "⚠️", "failing": "❌", "unsupported": "➖", "below_floor": "◔",
           "not_run": "·"}
    for impl in impls:
        if len(impls) > 1:
            lines += [f"**{md(impl)}**", ""]
        lines += ["| clause | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
        mine = [c for c in cert["cells"] if c["implementation"] == impl]
        for cid in dict.fromkeys(c["clause"] for c in mine):
            row = [f"{md(cid)} {md(titles.get(cid, ''))}"]
            for d in dtypes:
                c = next((x for x in mine if x["clause"] == cid and x["dtype"] == d), None)
                if c is None:
                    row.append("")
                    continue
                text = f"{sym[c['status']]} {c['checked']}"
                if c["divergent"]:
                    text += f" / {c['divergent']} ({', '.join(md(x) for x in c['divergences'])})"
                if c["status"] == "unsupported":
                    text = sym["unsupported"]
                row.append(text)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += ["Legend: ✅ conformant, ⚠️ divergent as documented, ❌ failing, ➖ out of the declared scope, "
              "◔ below the coverage floor, · not run.", "", "### Divergences", ""]
    if cert["divergences"]:
        for d in cert["divergences"]:
            if d.get("declared"):
                continue            # stated with the declarations above
            bound = f", bound {d['bound']:g}" if d.get("bound") is not None else ""
            where = "holds here" if d.get("holds", True) else f"inactive here ({d.get('condition', '')})"
            lines.append(f"- {md(d['id'])} ({md(d['clause'])}, {md(d['kind'])}): region {md(d.get('region', ''))}, "
                         f"instead {md(d.get('instead', ''))}{bound}; {md(where)}; witness: "
                         f"{md(d.get('witness_status', 'not run'))}. {md(d.get('reason', ''))}"
                         + (f" ({md(d['measured'])})" if d.get("measured") else "")
                         + (f" {md(d['link'])}" if d.get("link") else ""))
    else:
        lines.append("None.")
    if v.get("stale"):
        lines += ["", "**Stale divergence entries** (their witnesses conform now; the verdict is unaffected): "
                  + md(", ".join(v["stale"]))]
    lines += ["", "### Error ratios (e_kernel / e_base; passing requires e_kernel <= 2 e_base + a rounding floor)", "",
              "| dtype | worst ratio | cases |", "|---|---|---|"]
    lines += [f"| {md(dt)} | {format_ratio(r['max'])} | {r['cases']} |" for dt, r in cert["ratios"].items()]
    lines += ["", "### Environment", "", "| | |", "|---|---|"]
    lines += [f"| {md(k)} | {md(v)} |" for k, v in environment_rows({"run_id": cert["run_id"],
                                                                      "created": cert["created"], "environment": env})]
    return "\n".join(lines) + "\n"


def declared_lines(cert: dict[str, Any]) -> list[str]:
    """One sentence per behaviour the kernel declared (adapters/contract.py) with how many examples checked it,
    and its declared limits."""
    lines = []
    for d in cert["divergences"]:
        if d.get("declared"):
            n = d.get("examples") or 0
            state = ("contradicted: see the failed clauses" if d.get("contradicted") else
                     f"checked on {n} example(s)" if n else "never exercised (no example reached its region)")
            lines.append(f"- declared `{md(d['declared'])}` ({md(d['id'])}, {md(d['clause'])}): {md(state)}.")
    for name, s in cert["scopes"].items():
        for limit in (s["declared"].get("contract") or {}).get("limits", []):
            lines.append(f"- declared limit of {md(name)}: {md(limit)}; cases outside it are out of scope.")
    return ["", "### Declared behaviour and limits", ""] + lines if lines else []


def write(run: dict[str, Any], out_dir: Path, clauses: list[Clause] | None = None, name: str | None = None) -> tuple[Path, Path]:
    """Write certificates/<slug>.md and .json under out_dir; return both paths."""
    stem = name or slug(run)
    folder = out_dir / "certificates"
    return write_files(run, folder / f"{stem}.md", folder / f"{stem}.json", clauses)


def write_files(run: dict[str, Any], md_path: Path, json_path: Path,
                clauses: list[Clause] | None = None) -> tuple[Path, Path]:
    """Write the certificate of `run` as Markdown and JSON at the given paths (`attnconf certify`), and its
    badge as an SVG beside the Markdown (same name, .svg)."""
    clauses = clauses if clauses is not None else load_clauses()
    cert = build(run, clauses)
    for path in (md_path, json_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(render_markdown(cert, clauses), encoding="utf-8")
    md_path.with_suffix(".svg").write_text(badge.render(cert), encoding="utf-8")   # the README badge, beside it
    json_path.write_text(json.dumps(encode(cert), indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return md_path, json_path
