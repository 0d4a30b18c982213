"""The run file: what a run writes for the reports (reports/runfile.py's schema), as it goes and at its end.

A run never loses the results it has: the file is rewritten as records arrive (a run killed outright keeps
what it had; SIGINT and SIGTERM write it in full), at most every WRITE_EVERY_S and never spending more than
1/WRITE_COST_SHARE of the run on it (each write validates the whole file, which grows with the run: 0.1-0.2 s
for a jax ci run's 300 records, measured). A file that does not validate is kept beside, as .invalid.json.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attnconf

from attnconf.conformance.engine.cells import floor as cells_floor
from attnconf.conformance.engine.cells import implementations, kind
from attnconf.conformance.engine.records import ROOT

# the run's RunState (conformance/engine/run_state.py), which imports this module: named, not imported
RunState = Any

SUITE_VERSION = attnconf.__version__
WRITE_EVERY_S = 5.0
WRITE_COST_SHARE = 50


def git_revision() -> str | None:
    if not (ROOT / ".git").exists():      # an installed attnconf: its version says which suite ran
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(state: RunState) -> dict[str, Any]:
    """Where and with what the run ran: versions, device, precision flags, Hypothesis settings, scopes."""
    config = state.config
    import numpy as np
    from hypothesis import settings

    from attnconf import spec

    described = {}
    for a in state.session.impls:
        try:
            described[a.name] = a.describe()
        except Exception as exc:  # describe() of a broken kernel must not lose the run
            described[a.name] = {"error": f"{type(exc).__name__}: {exc}"}
    frameworks = {"numpy": np.__version__}
    for d in described.values():
        if isinstance(d, dict) and d.get("framework") and d.get("version"):
            frameworks[d["framework"]] = d["version"]
    first = next(iter(described.values()), {})
    prof = settings.default
    from attnconf.conformance.engine.divergences import cpu_flags

    return {
        "suite_version": SUITE_VERSION, "git_revision": git_revision(),
        "spec_hash": spec.spec_hash(), "backend": state.session.backend, "device": config.getoption("--device"),
        "device_name": first.get("device_name") or platform.processor() or platform.machine(),
        "compute_capability": first.get("compute_capability"),
        "frameworks": frameworks, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "sse4", "fma", "f16c"))),
        "precision_flags": {"allow_tf32": bool(state.session.options["allow_tf32"]),
                            **{k: v for d in described.values() if isinstance(d, dict)
                               for k, v in (d.get("precision_flags") or {}).items()}},
        "hypothesis": {"profile": config.getoption("--hypothesis-profile", default=None) or "dev",
                       "seed": config.getoption("--hypothesis-seed", default=None),
                       "max_examples": prof.max_examples, "derandomize": prof.derandomize},
        "kernel": config.getoption("--kernel"), "convention": config.getoption("--convention"),
        "isolated": bool(config.getoption("--isolate")),
        "run_timeout_s": config.getoption("--run-timeout"), "case_timeout_s": config.getoption("--case-timeout"),
        "implementations": described,
        "scopes": {a.name: scope(a) for a in state.session.impls},
    }


def scope(adapter) -> dict[str, Any]:
    """The implementation's declared scope for the run file and the certificate (adapters/scope.py's words)."""
    declared = dict(adapter.scope() if callable(getattr(adapter, "scope", None)) else {})
    caps = set(getattr(adapter, "capabilities", ()))
    out = {"kind": kind(adapter), "dtypes": list(getattr(adapter, "dtypes", ())), "grads": "grads" in caps,
           "dropout": "dropout" in caps, "features": sorted(caps - {"grads", "dropout"}),
           "max_head_dim": getattr(adapter, "max_head_dim", None)}
    out.update(declared)
    out.update(declared.get("limits") or {})
    return out


def build(state: RunState, *, final: bool) -> dict[str, Any]:
    """The run file as it stands: records, cells, divergences, verdict and causes (INCOMPLETE until `final`)."""
    from attnconf.conformance.engine.causes import group as group_causes
    from attnconf.conformance.engine.verdict import build_cells, decide, plan

    session = state.session
    records = [dict(r) for r in state.records]
    observations = [o for r in records for o in r.pop("observations", [])]
    panel: dict[str, list] = {}
    for r in records:
        for entry in r.pop("panel", []):
            panel.setdefault(r["implementation"], []).append(entry)
    witnessed: dict[str, dict[str, Any]] = {}
    for o in observations:
        if o["clause"] == "WITNESS":
            witnessed[o["key"]] = o["value"]
    observations = [o for o in observations if o["clause"] not in ("WITNESS",)]
    seen = {d for r in records for d in r["divergences"]}
    entries = {e["id"]: e for e in session.entries}
    from attnconf.conformance.engine.declared import examples as declared_examples
    floor = cells_floor()
    impls = implementations(session.impls)
    if state.plan is None:
        state.plan = plan(state.suite_modules)
    cells = build_cells(records, impls, state.plan, entries)
    stale = sorted(eid for eid, w in witnessed.items()
                   if isinstance(w, dict) and str(w.get("status", "")).startswith("stale"))
    complete = final and not state.interrupted and not session.out_of_time()
    v = decide(cells, records, floor=floor, complete=complete, apply_floor=session.replay is None, stale=stale)
    if not final:
        v["verdict"] = "INCOMPLETE"
        v["incomplete_reasons"] = ["the run is still going (or was stopped before its end)"]
    divs = []
    for e in session.entries:
        w = witnessed.get(e["id"])
        divs.append({"id": e["id"], "clause": e["clause"], "kind": e["kind"], "region": e["region"],
                     "instead": e["instead"], "quantities": e["quantities"], "dtypes": e["dtypes"],
                     "bound": e.get("bound"), "value": e.get("value"), "when": e["when"],
                     "holds": e["holds"], "condition": e["condition"], "reason": e["reason"],
                     "measured": e.get("measured", ""), "link": e.get("link") or None,
                     "implementations": e["implementations"], "observed": e["id"] in seen,
                     "witness": e["witness"],
                     **({"declared": e["declared"], "examples": declared_examples(records, e["id"]),
                         "contradicted": any(f"] {e['id']}: " in str(r.get("message") or "") for r in records)} if e.get("declared") else {}),
                     "witness_status": (w or {}).get("status", "not run") if isinstance(w, dict) else str(w or "not run"),
                     "witness_detail": (w or {}).get("detail", "") if isinstance(w, dict) else ""})
    stamp = _dt.datetime.now(_dt.timezone.utc)
    if state.environment is None:
        state.environment = environment(state)
    env = state.environment
    return {
        "schema_version": 2,
        "run_id": f"{session.backend}-{env['device']}-{dt_stamp(state.started)}-{os.getpid():x}",
        "created": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "complete": complete,
        "duration_s": round(time.time() - state.started, 1),
        "environment": env, "records": records, "observations": observations, "panel": panel,
        "cells": [c.as_dict(floor) for c in sorted(cells.values(), key=lambda c: (c.implementation, c.clause, c.dtype))],
        "divergences": divs, "verdict": v, "causes": group_causes(records),
    }


def dt_stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y%m%dT%H%M%S")


def write_partial(state: RunState, *, force: bool = False) -> None:
    """Rewrite the run file while the run goes (INCOMPLETE), unless it was written too recently for its cost."""
    path = state.config.getoption("--report")
    if not path or state.run is not None:
        return
    now = time.time()
    if not force and now - state.last_write < max(WRITE_EVERY_S, WRITE_COST_SHARE * state.write_cost):
        return
    state.last_write = now
    try:
        write(state, Path(path), build(state, final=False))
    except Exception as exc:  # a partial write must never stop the run
        sys.stderr.write(f"attnconf: could not update {path}: {type(exc).__name__}: {exc}\n")
    state.write_cost = time.time() - now


def write(state: RunState, path: Path, run: dict[str, Any]) -> None:
    """Write the run file; if it does not validate (a suite bug), keep the records anyway beside it."""
    import json

    from attnconf.reports import runfile

    try:
        runfile.write(path, run)
    except runfile.SchemaUnavailable as exc:
        # a run on a machine without jsonschema (a GPU image, say) keeps its results, unvalidated
        runfile.write(path, run, check=False)
        if not state.unvalidated_said:
            state.unvalidated_said = True
            sys.stderr.write(f"attnconf: {exc}; it is written unvalidated\n")
    except runfile.RunFileError as exc:
        keep = path.with_suffix(".invalid.json")
        keep.write_text(json.dumps(runfile.encode(run), indent=1) + "\n")
        raise runfile.RunFileError(f"{exc}; the records are kept in {keep}") from None
