"""Certificates: what one run of a third-party kernel established, as Markdown for a PR and JSON.

A certificate is derived only from the run file, so anyone can regenerate and check it. A clause
counts as covered when at least one record cited it and none of them failed; a documented
divergence is listed as such, never as a pass.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnconf.reports.markdown import md
from attnconf.reports.merge import Clause, environment_rows, format_ratio, load_clauses, record_state, worst_ratio
from attnconf.reports.runfile import encode

CERTIFICATE_VERSION = 1


def slug(run: dict[str, Any]) -> str:
    env = run["environment"]
    text = f"{env.get('kernel') or 'kernel'}-{env['backend']}-{env['device']}"
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "kernel"


def clause_states(run: dict[str, Any]) -> dict[str, str]:
    """Worst record state per clause cited in the run; failed_clauses in the verdict count as failing."""
    rank = {"unsupported": 1, "conformant": 2, "divergent": 3, "failing": 4}
    states: dict[str, str] = {}
    for rec in run["records"]:
        state = record_state(rec)
        for cid in rec["clauses"]:
            if rank[state] > rank.get(states.get(cid, ""), 0):
                states[cid] = state
    for cid in run["verdict"].get("failed_clauses") or []:
        states[cid] = "failing"
    return states


def ratios_by_dtype(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in run["records"]:
        for dtype, stats in (rec.get("ratios") or {}).items():
            agg = out.setdefault(dtype, {"max": None, "cases": 0})
            agg["max"] = worst_ratio(agg["max"], stats.get("max"))
            agg["cases"] += int(stats.get("cases") or 0)
    return dict(sorted(out.items()))


def build(run: dict[str, Any], clauses: list[Clause] | None = None) -> dict[str, Any]:
    """The certificate as plain data (what the JSON file holds)."""
    clauses = clauses if clauses is not None else load_clauses()
    states = clause_states(run)
    listed = [c.id for c in clauses] + [cid for cid in states if cid not in {c.id for c in clauses}]
    by_state: dict[str, list[str]] = {"conformant": [], "divergent": [], "failing": [], "unsupported": [], "not_run": []}
    for cid in listed:
        by_state[states.get(cid, "not_run")].append(cid)
    env = run["environment"]
    return {
        "certificate_version": CERTIFICATE_VERSION,
        # a third-party kernel, or (attnconf certify --impl) the built-in implementations that ran
        "kernel": env.get("kernel") or ", ".join(env.get("implementations") or {}) or None,
        "run_id": run["run_id"],
        "created": run["created"],
        "verdict": run["verdict"]["verdict"],
        "clauses": by_state,
        "clause_coverage": run.get("clause_coverage") or {},
        "divergences": run.get("divergences") or [],
        "ratios": ratios_by_dtype(run),
        "environment": env,
    }


def render_markdown(cert: dict[str, Any], clauses: list[Clause] | None = None) -> str:
    titles = {c.id: c.title for c in (clauses if clauses is not None else load_clauses())}
    env = cert["environment"]

    def clause_list(ids: list[str]) -> str:
        return ", ".join(f"{md(cid)} ({md(titles[cid])})" if cid in titles else md(cid) for cid in ids) or "none"

    c = cert["clauses"]
    lines = [
        f"## attnconf certificate: {md(cert['kernel'])}",
        "",
        f"**Verdict: {md(cert['verdict'])}** on {md(env['backend'])} / {md(env['device'])}"
        f" ({md(env.get('device_name') or '')}); run {md(cert['run_id'])}, {md(cert['created'])}.",
        "",
        f"- Conformant clauses ({len(c['conformant'])}): {clause_list(c['conformant'])}",
        f"- Clauses within documented divergences ({len(c['divergent'])}): {clause_list(c['divergent'])}",
        f"- **Failing clauses ({len(c['failing'])})**: {clause_list(c['failing'])}",
        f"- Unsupported ({len(c['unsupported'])}): {clause_list(c['unsupported'])}",
        f"- Not covered by this run ({len(c['not_run'])}): {clause_list(c['not_run'])}",
        "",
        "### Divergences",
        "",
    ]
    if cert["divergences"]:
        lines += [f"- {md(d['id'])} ({md(d['clause'])}, {md(d['kind'])}): {md(d.get('reason', ''))}"
                  + (f" {md(d['link'])}" if d.get("link") else "") for d in cert["divergences"]]
    else:
        lines.append("None.")
    lines += ["", "### Error ratios (e_kernel / e_base; passing requires e_kernel <= 2 e_base + a rounding floor)", "",
              "| dtype | worst ratio | cases |", "|---|---|---|"]
    lines += [f"| {md(dt)} | {format_ratio(r['max'])} | {r['cases']} |" for dt, r in cert["ratios"].items()]
    lines += ["", "### Environment", "", "| | |", "|---|---|"]
    lines += [f"| {md(k)} | {md(v)} |" for k, v in environment_rows({"run_id": cert["run_id"],
                                                                      "created": cert["created"], "environment": env})]
    return "\n".join(lines) + "\n"


def write(run: dict[str, Any], out_dir: Path, clauses: list[Clause] | None = None, name: str | None = None) -> tuple[Path, Path]:
    """Write certificates/<slug>.md and .json under out_dir; return both paths."""
    stem = name or slug(run)
    folder = out_dir / "certificates"
    return write_files(run, folder / f"{stem}.md", folder / f"{stem}.json", clauses)


def write_files(run: dict[str, Any], md_path: Path, json_path: Path,
                clauses: list[Clause] | None = None) -> tuple[Path, Path]:
    """Write the certificate of `run` as Markdown and JSON at the given paths (`attnconf certify`)."""
    clauses = clauses if clauses is not None else load_clauses()
    cert = build(run, clauses)
    for path in (md_path, json_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(render_markdown(cert, clauses), encoding="utf-8")
    json_path.write_text(json.dumps(encode(cert), indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    return md_path, json_path
