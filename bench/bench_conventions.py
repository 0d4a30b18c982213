"""The convention catalogue against the suite: which test catches each bug, how soon, and what a full run costs.

    .venv/bin/python bench/bench_conventions.py [--bugs a,b] [--no-controls] [--profile ci]
                                                [--output bench/conventions.json]

For each kernel of tests/kernels/flash_buggy.py: one `pytest conformance --backend=torch
--kernel=... --convention=... -x` subprocess, recording the test that failed first, its
examples, the wall time to that failure and the CPU time (user + system of the subprocess;
interpreter start, torch import and collection included in both). For each correct kernel of
tests/kernels/flash.py (and the half-precision one without its declaration): one full run, its
verdict and times. Wall times on a shared machine are noisy; the CPU times say what the suite
itself costs.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.runner import ROOT, run_suite  # noqa: E402

CONTROLS = {"flash_attn_func": "flash_attn", "flash_attn_varlen_func": "flash_attn_varlen",
            "flash_attn_with_kvcache": "flash_attn_kvcache", "single_prefill_with_kv_cache": "flashinfer_prefill",
            "single_decode_with_kv_cache": "flashinfer_decode", "flash_attn_func_half": "flash_attn",
            "flash_attn_func_half_undeclared": "flash_attn", "flash_alt:flash_attn_func": "flash_attn",
            "flash_alt:flash_attn_varlen_func": "flash_attn_varlen",
            "flash_alt:flash_attn_with_kvcache": "flash_attn_kvcache"}


def catalogue() -> dict[str, str]:
    """bug name -> convention, read from tests/kernels/flash_buggy.py without importing torch."""
    tree = ast.parse((ROOT / "tests" / "kernels" / "flash_buggy.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "bug":
            conv = next((k.value.value for k in node.keywords if k.arg == "convention"), None)
            first = node.args[0]
            name = None
            if isinstance(first, ast.Call) and len(first.args) >= 2 and isinstance(first.args[1], ast.Constant):
                name = first.args[1].value
            elif isinstance(first, ast.Name):
                name = first.id
            elif isinstance(first, ast.Call) and getattr(first.func, "id", "") == "_ignore_mask":
                name = "flashinfer_mask_ignored"
            if name and conv:
                out[name] = conv
    return out


def timed(kernel: str, convention: str, report: Path, profile: str, stop: bool):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = run_suite("torch", report, kernel=kernel, profile=profile, stop_at_first=stop,
                    extra=(f"--convention={convention}",), in_process=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return run, round(cpu, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bugs", default=None, help="comma-separated subset of the catalogue")
    ap.add_argument("--no-controls", action="store_true")
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--output", default=str(ROOT / "bench" / "conventions.json"))
    args = ap.parse_args()
    bugs = catalogue()
    if args.bugs:
        bugs = {b: bugs[b] for b in args.bugs.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="attnconf-conv-"))
    rows = []
    for name, conv in bugs.items():
        run, cpu = timed(f"tests.kernels.flash_buggy:{name}", conv, tmp / f"{name}.json", args.profile, True)
        f = run.first_failure or {}
        rows.append({"bug": name, "convention": conv, "caught": run.returncode == 1 and bool(f),
                     "caught_by": run.caught_by, "clauses": f.get("clauses"), "examples": f.get("examples"),
                     "test_s": f.get("duration_s"), "wall_s": round(run.wall_s, 2), "cpu_s": cpu,
                     "message": (f.get("message") or "")[:300]})
        print(f"{name:34s} {conv:19s} rc={run.returncode} wall {run.wall_s:6.1f} s cpu {cpu:5.1f} s  "
              f"{run.caught_by}  examples={f.get('examples')}", flush=True)
    caught = [r for r in rows if r["caught"]]
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "loadavg_at_end": os.getloadavg()}, "profile": args.profile,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bugs": rows,
              "caught": len(caught), "total": len(rows),
              "median_wall_to_first_failure_s": round(statistics.median(r["wall_s"] for r in caught), 2) if caught else None,
              "median_cpu_to_first_failure_s": round(statistics.median(r["cpu_s"] for r in caught), 2) if caught else None}
    if not args.no_controls:
        result["controls"] = {}
        for name, conv in CONTROLS.items():
            module, _, attr = name.rpartition(":")
            run, cpu = timed(f"tests.kernels.{module or 'flash'}:{attr}", conv, tmp / f"ctl-{attr}-{module}.json",
                             args.profile, False)
            verdict = (run.report or {}).get("verdict", {}).get("verdict")
            statuses: dict[str, int] = {}
            for r in (run.report or {}).get("records", []):
                statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            result["controls"][name] = {"convention": conv, "returncode": run.returncode, "verdict": verdict,
                                        "wall_s": round(run.wall_s, 2), "cpu_s": cpu, "statuses": statuses,
                                        "first_failure": run.first_failure}
            print(f"{name:34s} {conv:19s} {verdict} wall {run.wall_s:6.1f} s cpu {cpu:5.1f} s {statuses}", flush=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"caught {len(caught)}/{len(rows)}; median to first failure: wall {result['median_wall_to_first_failure_s']} s, "
          f"cpu {result['median_cpu_to_first_failure_s']} s -> {args.output}")
    return 0 if len(caught) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
