"""Keep divergence entries honest where they hold: fail on a stale entry (`make test`).

    python -m attnconf.conformance.engine.entries_check RUN.json [RUN.json ...]
    python -m attnconf.conformance.engine.entries_check --witnesses [--backends a,b] [--out DIR]

The second form runs, for every installed backend (and each opt-in implementation that has an entry),
only the witness tests (conformance/test_divergences.py) in a process of its own, then checks the
run files it wrote. That is what `make test` does: it keeps every entry honest in seconds per
backend, where the whole ci suites of all backends are `make report`'s job. A run of the witness
tests alone is not a certification (its verdict is INCOMPLETE by the coverage floor); only the
entries' witness statuses are read from it, and an entry that holds here but whose witness never
ran is a failure too.

A stale entry (its witness conforms now) never changes a kernel's verdict: the implementation got
better. But the project's own divergence files must not keep it, so this check, run by `make test` on
the run files of the ci suites, fails on every entry that holds on this machine and is stale, and on
every entry whose witness behaves neither as the spec nor as the entry says. Entries whose conditions
exclude this machine are listed, not judged.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from attnconf.reports.runfile import RunFileError, load


def problems(run: dict, *, require_witness: bool = False) -> tuple[list[str], list[str]]:
    """(problems, notes) of one run file; `require_witness`: an entry that holds here must have had
    its witness run (a witness-only run; a filtered run of the whole suite may leave some out)."""
    from fnmatch import fnmatch

    bad, notes = [], []
    ran = list((run.get("environment") or {}).get("implementations") or {})
    for d in run.get("divergences") or []:
        status = str(d.get("witness_status", "not run"))
        if ran and not any(fnmatch(i, p) for i in ran for p in d.get("implementations") or ()):
            continue                # an entry about an implementation this run did not load
        if not d.get("holds", True):
            notes.append(f"{d['id']}: inactive here ({d.get('condition', '')})")
        elif require_witness and status == "not run":
            bad.append(f"{d['id']}: its witness did not run (see the run's output above)")
        elif status.startswith("stale"):
            bad.append(f"{d['id']}: stale here (its witness conforms: {d.get('witness_detail', '')}); "
                       f"narrow or remove the entry, or state the conditions under which it holds")
        elif status == "other":
            bad.append(f"{d['id']}: its witness behaves neither as the spec nor as the entry says "
                       f"({d.get('witness_detail', '')})")
    return bad, notes


def witness_jobs(backends: list[str]) -> list[tuple[str, str | None]]:
    """(backend, implementation) per process: each backend's default implementations together, then
    each opt-in implementation (registry.py) that some entry names, alone."""
    from attnconf.adapters.registry import REGISTRY
    from attnconf.conformance.engine.divergences import backend_entries

    jobs: list[tuple[str, str | None]] = []
    for b in backends:
        named = {i for e in backend_entries(b) for i in e.get("implementations", ())}
        jobs.append((b, None))
        jobs += [(b, name) for name, _ in REGISTRY[b].opt_in if name in named]
    return jobs


def run_witnesses(backends: list[str], out: Path, workers: int = 2) -> list[Path]:
    """Run the witness tests of each job in its own process, `workers` at a time (each mostly imports its
    framework); the run files written, and each job's line printed in the jobs' order."""
    from concurrent.futures import ThreadPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]

    def one(job: tuple[str, str | None]) -> tuple[Path, subprocess.CompletedProcess]:
        backend, impl = job
        label = backend if impl is None else impl.replace(":", "-")
        path = out / f"witnesses-{label}.json"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", "conformance/test_divergences.py", f"--backend={backend}",
               f"--report={path}", "-q", "-p", "no:cacheprovider", "--no-header"]
        if impl is not None:
            cmd.append(f"--impl={impl}")
        return path, subprocess.run(cmd, cwd=root, env=os.environ, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)

    jobs = witness_jobs(backends)
    paths = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (backend, impl), (path, done) in zip(jobs, pool.map(one, jobs)):
            # The witness tests alone are below the coverage floor: exit 2 (INCOMPLETE) is expected; the
            # run file says whether each witness behaved as declared. Anything else shows the output.
            tail = done.stdout.strip().splitlines()[-1:] or [""]
            print(f"== witnesses of {impl or backend}: {tail[0]}", flush=True)
            if done.returncode not in (0, 2) or not path.exists():
                print(done.stdout, flush=True)
                print(f"entries_check: the witness run of {impl or backend} ended with exit status {done.returncode}",
                      file=sys.stderr)
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*")
    p.add_argument("--witnesses", action="store_true", help="run every installed backend's witness tests first")
    p.add_argument("--backends", default="", help="with --witnesses: comma-separated backends (default: all installed)")
    p.add_argument("--out", default=".attnconf-ci", help="with --witnesses: where the run files go")
    args = p.parse_args(argv)
    if args.witnesses:
        from attnconf.adapters.registry import REGISTRY

        backends = [b for b in args.backends.split(",") if b] or [n for n, b in REGISTRY.items() if b.installed()]
        unknown = [b for b in backends if b not in REGISTRY]
        if unknown:
            print(f"entries_check: unknown backend(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}", file=sys.stderr)
            return 2
        args.runs = [str(x) for x in run_witnesses(backends, Path(args.out))]
    elif not args.runs:
        p.error("give run files, or --witnesses")
    failed = False
    for path in args.runs:
        try:
            run = load(path)
        except RunFileError as exc:
            print(f"entries_check: {exc}", file=sys.stderr)
            return 2
        bad, notes = problems(run, require_witness=args.witnesses)
        for n in notes:
            print(f"{path}: {n}")
        for b in bad:
            print(f"{path}: {b}")
        failed |= bool(bad)
    if not failed:
        print("entries_check: every entry that holds here diverges as declared")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
