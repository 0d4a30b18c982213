"""How long the suite takes, and how soon it catches a planted bug.

    .venv/bin/python bench/bench_suite.py [--backends numpy,torch] [--no-catalogue] [--only-catalogue]
                                          [--bugs a,b] [--profile ci] [--output bench/results.json]

For each installed backend: one `pytest conformance --backend=X --durations=15`
subprocess (wall time, statuses, slowest tests). For the bug catalogue
(tests/kernels/buggy.py, torch): one `-x` run per bug, recording the test that
failed first, its examples, and the wall time to that failure (interpreter
start, torch import and collection included); the two correct kernels are run
in full and must pass. Everything goes to bench/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.runner import ROOT, SuiteRun, run_suite  # noqa: E402


def bug_names() -> list[str]:
    """The catalogue's bug names, read without importing torch into this process."""
    import ast  # noqa: PLC0415

    tree = ast.parse((ROOT / "tests" / "kernels" / "buggy.py").read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "bug" for d in n.decorator_list)]


def summarise(run: SuiteRun) -> dict:
    records = (run.report or {}).get("records", [])
    return {"returncode": run.returncode, "wall_s": round(run.wall_s, 2),
            "statuses": dict(Counter(r.get("status") for r in records)),
            "examples": sum(r.get("examples") or 0 for r in records),
            "verdict": (run.report or {}).get("verdict"),
            "slowest": [{"s": s, "phase": p, "test": t} for s, p, t in run.durations()]}


def bench_backends(backends: list[str], profile: str, tmp: Path) -> dict:
    out = {}
    for backend in backends:
        run = run_suite(backend, tmp / f"{backend}.json", profile=profile, extra=("--durations=15",), in_process=False)
        out[backend] = summarise(run)
        print(f"{backend}: rc={run.returncode} {run.wall_s:.1f} s {out[backend]['statuses']}", flush=True)
    return out


def bench_catalogue(bugs: list[str], profile: str, tmp: Path, correct: bool) -> dict:
    table = []
    for name in bugs:
        run = run_suite("torch", tmp / f"bug-{name}.json", kernel=f"tests.kernels.buggy:{name}", profile=profile,
                        stop_at_first=True, in_process=False)
        f = run.first_failure or {}
        row = {"bug": name, "caught": run.returncode == 1 and bool(f), "returncode": run.returncode,
               "caught_by": run.caught_by, "examples": f.get("examples"), "test_s": f.get("duration_s"),
               "wall_s": round(run.wall_s, 2), "message": (f.get("message") or "")[:400], "case": f.get("case")}
        if not f and run.returncode != 0:
            row["output_tail"] = run.output_tail[-800:]
        table.append(row)
        print(f"{name:30s} rc={run.returncode} {run.wall_s:6.1f} s  {run.caught_by}  examples={f.get('examples')}",
              flush=True)
    caught = [r["wall_s"] for r in table if r["caught"]]
    result = {"bugs": table, "caught": len(caught), "total": len(table),
              "median_time_to_first_failure_s": round(statistics.median(caught), 2) if caught else None}
    if correct:
        result["correct"] = {}
        for name in ("naive", "tiled"):
            run = run_suite("torch", tmp / f"correct-{name}.json", kernel=f"tests.kernels.correct:{name}",
                            profile=profile, in_process=False)
            result["correct"][name] = {**summarise(run), "first_failure": run.first_failure}
            print(f"correct {name}: rc={run.returncode} {run.wall_s:.1f} s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    from attnconf import adapters  # noqa: PLC0415 (after sys.path is set)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=",".join(adapters.available_backends()))
    p.add_argument("--profile", default="ci")
    p.add_argument("--bugs", default=None, help="comma-separated subset of the catalogue")
    p.add_argument("--no-catalogue", action="store_true")
    p.add_argument("--only-catalogue", action="store_true")
    p.add_argument("--no-correct", action="store_true", help="skip the full runs of the correct kernels")
    p.add_argument("--output", default=str(ROOT / "bench" / "results.json"))
    args = p.parse_args(argv)
    results: dict = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "profile": args.profile,
                     "machine": {"python": platform.python_version(), "platform": platform.platform(),
                                 "cpus": os.cpu_count()}}
    with tempfile.TemporaryDirectory(prefix="attnconf-bench-") as tmp:
        if not args.only_catalogue:
            results["backends"] = bench_backends([b for b in args.backends.split(",") if b], args.profile, Path(tmp))
        if not args.no_catalogue and "torch" in adapters.available_backends():
            bugs = args.bugs.split(",") if args.bugs else bug_names()
            results["catalogue"] = bench_catalogue(bugs, args.profile, Path(tmp), not args.no_correct)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    cat = results.get("catalogue")
    if cat:
        print(f"caught {cat['caught']}/{cat['total']}; median time to first failure "
              f"{cat['median_time_to_first_failure_s']} s")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
