"""How fast the suite is on this machine, measured against the floor: `make bench`.

    .venv/bin/python bench/bench_suite.py [--floor-runs 5] [--no-catalogue] [--bugs a,b] [--no-certify]
                                          [--backends numpy,torch | --all-backends] [--make-test] [--make-report]
                                          [--profile ci] [--output bench/results.json] [--readme README.md]

Every time is a whole process, timed from outside (interpreter start, imports and collection included),
and is reported with its ratio to the *floor*: interpreter start plus importing the framework, numpy,
hypothesis and pytest, and nothing of attnconf. Absolute times on shared machines vary by 10-40 %; the
ratios travel. CPU seconds (user + system of the process and its children) are recorded beside each wall
time: on a machine shared with other jobs they say what the run itself cost.

Parts (the cheap ones run by default):
  floor       the median of --floor-runs imports, per framework the other parts use;
  catalogue   one `pytest conformance --kernel=... -x` process per kernel of the catalogue
              (tests/kernels/buggy.py and flash_buggy.py on torch, variant_bugs.py on numpy): which test
              caught it and the time to that first failure; median and worst;
  certify     `attnconf certify --backend torch --kernel tests.kernels.correct:naive`, ci profile, twice: with
              no stored baselines, then reading those the first stored (ATTNCONF_BASELINE_CACHE);
  backends    (--backends / --all-backends) the ci run of each installed backend;
  make test / make report  (--make-test / --make-report) in a fresh clone of this checkout's HEAD.

Writes bench/results.json (with the machine's description) and the table between the bench markers
of README.md (bench/bench_table.py).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bench_table  # noqa: E402
from bench.runner import ROOT, SuiteRun, run_suite  # noqa: E402

PY = sys.executable
FLOOR_IMPORTS = ("numpy", "hypothesis", "pytest")
CERTIFY_KERNEL = "tests.kernels.correct:naive"
# the catalogue, listed by a child process (this one never imports torch: its own imports stay off the clock)
LIST_CATALOGUE = """
import json
from tests.kernels import buggy, flash_buggy, variant_bugs
rows = [("torch", f"tests.kernels.buggy:{n}", None) for n in sorted(buggy.BUGS)]
rows += [("torch", f"tests.kernels.flash_buggy:{n}", f.convention) for n, f in sorted(flash_buggy.BUGS.items())]
rows += [("numpy", f"tests.kernels.variant_bugs:{n}", None) for n in sorted(variant_bugs.BUGS)]
print(json.dumps(rows))
"""
FRAMEWORK = {"numpy": "numpy", "torch": "torch", "jax": "jax", "tensorflow": "tensorflow", "onnx": "onnxruntime",
             "tinygrad": "tinygrad", "transformers": "transformers", "flax": "flax", "equinox": "equinox"}


def timed(cmd: list[str], *, cwd: Path = ROOT, timeout: float = 3600, env: dict | None = None) -> dict[str, Any]:
    """Run one process; its wall seconds, CPU seconds (it and its children) and exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "returncode": proc.returncode,
            "output_tail": (proc.stdout + proc.stderr)[-1500:]}


def measure_floor(framework: str, runs: int) -> dict[str, Any]:
    """Interpreter start plus importing the framework, numpy, hypothesis and pytest (nothing of attnconf)."""
    modules = [framework, *(m for m in FLOOR_IMPORTS if m != framework)]
    cmd = [PY, "-c", "import " + ", ".join(modules)]
    timed(cmd)                                                     # warm the file cache; not counted
    samples = [timed(cmd) for _ in range(runs)]
    bad = [s for s in samples if s["returncode"] != 0]
    if bad:
        raise SystemExit(f"bench: `{' '.join(cmd)}` failed: {bad[0]['output_tail']}")
    return {"imports": modules, "runs": runs, "wall_s": _median(s["wall_s"] for s in samples),
            "cpu_s": _median(s["cpu_s"] for s in samples), "samples_wall_s": [s["wall_s"] for s in samples]}


def _median(values) -> float:
    return round(statistics.median(list(values)), 3)


def _with_cpu(fn, *args, **kwargs) -> tuple[SuiteRun, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = fn(*args, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return run, round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3)


def catalogue_kernels(bugs: list[str] | None) -> list[tuple[str, str, str | None]]:
    proc = subprocess.run([PY, "-c", LIST_CATALOGUE], cwd=ROOT, capture_output=True, text=True, check=True)
    rows = [tuple(r) for r in json.loads(proc.stdout)]
    if bugs:
        rows = [r for r in rows if r[1].split(":")[1] in bugs]
    return rows


def bench_catalogue(kernels: list[tuple[str, str, str | None]], floors: dict[str, dict], profile: str,
                    tmp: Path) -> dict[str, Any]:
    """One -x process per kernel; each time also as a ratio to the floor of the kernel's own framework."""
    table = []
    for backend, kernel, convention in kernels:
        extra = (f"--convention={convention}",) if convention else ()
        run, cpu = _with_cpu(run_suite, backend, tmp / "bug.json", kernel=kernel, profile=profile,
                             stop_at_first=True, extra=extra, in_process=False)
        f = run.first_failure or {}
        floor = floors[FRAMEWORK[backend]]
        table.append({"backend": backend, "kernel": kernel, "convention": convention,
                      "caught": run.returncode == 1 and bool(f), "caught_by": run.caught_by,
                      "clause": f.get("failed_clause") or (f.get("clauses") or [None])[0],
                      "examples": f.get("examples"), "wall_s": round(run.wall_s, 3), "cpu_s": cpu,
                      "wall_floors": round(run.wall_s / floor["wall_s"], 2), "cpu_floors": round(cpu / floor["cpu_s"], 2)})
        print(f"{kernel:55s} {run.wall_s:6.1f} s  cpu {cpu:5.1f} s  {(run.caught_by or 'NOT CAUGHT')[-70:]}",
              flush=True)
    caught = [r for r in table if r["caught"]]
    out: dict[str, Any] = {"kernels": table, "caught": len(caught), "total": len(table)}
    if caught:
        worst = max(caught, key=lambda r: r["wall_floors"])
        out.update({key: _median(r[key] for r in caught) for key in ("wall_s", "cpu_s", "wall_floors", "cpu_floors")})
        out["worst"] = {k: worst[k] for k in ("kernel", "wall_s", "cpu_s", "wall_floors", "cpu_floors")}
    return out


def bench_certify(profile: str, tmp: Path, baselines: Path) -> dict[str, Any]:
    """One certify with the emulated baselines kept in `baselines` (ATTNCONF_BASELINE_CACHE): the first run in an
    empty folder emulates them all, a second reads what the first stored (the ci profile draws the same cases)."""
    out = tmp / "certify"
    env = {**os.environ, "ATTNCONF_BASELINE_CACHE": str(baselines)}
    row = timed([PY, "-m", "attnconf", "certify", "--backend", "torch", "--kernel", CERTIFY_KERNEL,
                 "--profile", profile, "--out", str(out)], env=env)
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    row.update(kernel=CERTIFY_KERNEL, verdict=(run.get("verdict") or {}).get("verdict"))
    if row["returncode"] == 0:
        row.pop("output_tail")
    print(f"certify {CERTIFY_KERNEL}: {row['wall_s']:.1f} s, cpu {row['cpu_s']:.1f} s, {row['verdict']}", flush=True)
    return row


def bench_backends(backends: list[str], profile: str, tmp: Path) -> dict[str, Any]:
    out = {}
    for backend in backends:
        run, cpu = _with_cpu(run_suite, backend, tmp / f"{backend}.json", profile=profile,
                             extra=("--durations=15",), in_process=False)
        records = (run.report or {}).get("records", [])
        out[backend] = {"returncode": run.returncode, "wall_s": round(run.wall_s, 2), "cpu_s": cpu,
                        "statuses": dict(Counter(r.get("status") for r in records)),
                        "examples": sum(r.get("examples") or 0 for r in records),
                        "verdict": ((run.report or {}).get("verdict") or {}).get("verdict"),
                        "slowest": [{"s": s, "phase": p, "test": t} for s, p, t in run.durations()]}
        out[backend]["compile_per_shape"] = compiles_per_shape(backend)
        print(f"{backend}: rc={run.returncode} {run.wall_s:.1f} s {out[backend]['verdict']}", flush=True)
    return out


def compiles_per_shape(backend: str) -> bool:
    """Whether an implementation of the backend compiles each new shape (its adapter's example_budget < 1),
    asked of a child process so that this one never imports a framework."""
    code = ("from attnconf import adapters; "
            f"print(min(getattr(a, 'example_budget', 1.0) for a in adapters.load({backend!r})) < 1)")
    proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip().endswith("True")


def bench_fresh_clone(targets: list[str], tmp: Path) -> dict[str, Any]:
    """`make TARGET` in a fresh clone of HEAD (its own venv from requirements.lock: set-up included)."""
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    out = {}
    for target in targets:
        row = timed(["make", target], cwd=clone, timeout=7200)
        out[f"make {target}"] = row
        print(f"make {target} (fresh clone): {row['wall_s']:.0f} s, exit {row['returncode']}", flush=True)
    return out


def machine() -> dict[str, Any]:
    import platform

    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal")), 0)
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    from attnconf import adapters  # noqa: PLC0415 (after sys.path is set)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="ci")
    p.add_argument("--floor-runs", type=int, default=5)
    p.add_argument("--bugs", default=None, help="comma-separated subset of the catalogue (kernel names)")
    p.add_argument("--no-catalogue", action="store_true")
    p.add_argument("--no-certify", action="store_true")
    p.add_argument("--backends", default="", help="comma-separated backends whose ci run is timed")
    p.add_argument("--all-backends", action="store_true", help="time the ci run of every installed backend")
    p.add_argument("--make-test", action="store_true", help="time `make test` in a fresh clone (long)")
    p.add_argument("--make-report", action="store_true", help="time `make report` in a fresh clone (long)")
    p.add_argument("--output", default=str(ROOT / "bench" / "results.json"))
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="README whose bench table is rewritten ('' = none)")
    args = p.parse_args(argv)
    backends = adapters.available_backends() if args.all_backends else [b for b in args.backends.split(",") if b]
    results: dict[str, Any] = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "profile": args.profile,
                               "machine": machine()}
    frameworks = {"torch", "numpy"} | {FRAMEWORK[b] for b in backends}
    results["floor"] = {fw: measure_floor(fw, args.floor_runs) for fw in sorted(frameworks)}
    for fw, f in results["floor"].items():
        print(f"floor ({', '.join(f['imports'])}): {f['wall_s']:.2f} s, cpu {f['cpu_s']:.2f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="attnconf-bench-") as tmp:
        if not args.no_catalogue:
            # a folder of its own: what make test or an earlier bench stored must not shorten these runs
            os.environ["ATTNCONF_BASELINE_CACHE"] = str(Path(tmp) / "catalogue-baselines")
            kernels = catalogue_kernels(args.bugs.split(",") if args.bugs else None)
            results["catalogue"] = bench_catalogue(kernels, results["floor"], args.profile, Path(tmp))
            results["catalogue"]["sample"] = args.bugs        # None: the whole catalogue
        if not args.no_certify:
            results["certify"] = bench_certify(args.profile, Path(tmp), Path(tmp) / "baselines")
            results["certify_warm"] = bench_certify(args.profile, Path(tmp), Path(tmp) / "baselines")
        if backends:
            os.environ["ATTNCONF_BASELINE_CACHE"] = str(Path(tmp) / "backend-baselines")
            results["backends"] = bench_backends(backends, args.profile, Path(tmp))
        targets = [t for t, on in (("test", args.make_test), ("report", args.make_report)) if on]
        if targets:
            results["fresh_clone"] = bench_fresh_clone(targets, Path(tmp))
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    table = bench_table.render(results)
    print(table)
    if args.readme:
        bench_table.write_into(Path(args.readme), table)
    print(f"wrote {args.output}" + (f" and the table in {args.readme}" if args.readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
