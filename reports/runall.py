"""The main job (`make report`): every installed backend, one process each, then the merge.

Each backend runs `pytest conformance --backend=NAME --report=reports/runs/NAME-DEVICE.json`
in its own process (one framework per process), `--jobs` of them at a time (default: one per CPU
core; each backend's run is essentially single-threaded, so two cores run two backends in about the
time of one). Progress is printed as it goes; a backend that fails or crashes keeps its own record
if it wrote one and never costs the others theirs; the merge runs on whatever run files exist.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def installed() -> list[str]:
    """The registry's backends that can run here (adapter present, framework installed); imports no framework."""
    from attnconf.adapters.registry import REGISTRY

    return [name for name, b in REGISTRY.items() if b.installed()]


def jobs(backends: list[str]) -> list[tuple[str, str | None]]:
    """(backend, implementation) per process: each backend's default implementations together, then
    each of its opt-in implementations (registry.py: too slow for a default run) alone."""
    from attnconf.adapters.registry import REGISTRY

    out: list[tuple[str, str | None]] = []
    for b in backends:
        out.append((b, None))
        out += [(b, name) for name, _ in getattr(REGISTRY.get(b), "opt_in", ())]
    return out


_PRINT = threading.Lock()


def _say(text: str, end: str = "\n") -> None:
    with _PRINT:
        print(text, end=end, flush=True)


def run_backend(backend: str, device: str, runs: Path, profile: str, extra: list[str],
                impl: str | None = None, progress: bool = True) -> tuple[int, float, Path]:
    label = backend if impl is None else impl.replace(":", "-")
    path = runs / f"{label}-{device}.json"
    if impl is not None:
        extra = [f"--impl={impl}", *extra]
    cmd = [sys.executable, "-m", "pytest", "conformance", f"--backend={backend}", f"--device={device}",
           f"--hypothesis-profile={profile}", f"--report={path}", "-q", "-rN", "-p", "no:cacheprovider", *extra]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    started = time.time()
    done = 0
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            ticks = re.fullmatch(r"([.FEsxXD]+)\s*(\[\s*\d+%\])?\s*", line.strip() + " ")
            if ticks:
                done += len(ticks.group(1))
                if progress:
                    _say(f"\r  {label}: {done} tests done {ticks.group(2) or ''}", end="")
            elif line.startswith(("verdict:", "ERROR", "FAILED", "  FAIL", "  CRASHED", "  TIMEOUT")):
                _say(f"\n  {label}: {line.rstrip()}" if progress else f"  {label}: {line.rstrip()}")
    if progress:
        _say("")
    return proc.returncode, time.time() - started, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--profile", default="ci")
    p.add_argument("--out", default=str(ROOT / "reports"))
    p.add_argument("--backends", default=",".join(installed()))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="backends run at a time (default: the number of CPU cores)")
    args, extra = p.parse_known_args(argv)
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    todo = jobs([b for b in args.backends.split(",") if b])
    width = max(1, min(args.jobs, len(todo)))
    started = time.time()

    def one(job: tuple[str, str | None]) -> tuple[str, str, int, float]:
        backend, impl = job
        label = impl or backend
        _say(f"[{label}] running the conformance suite on {args.device} ...")
        code, secs, path = run_backend(backend, args.device, runs, args.profile, extra, impl, progress=width == 1)
        verdict = "no run file"
        if path.exists():
            try:
                verdict = json.loads(path.read_text())["verdict"]["verdict"]
            except (ValueError, KeyError):
                verdict = "unreadable run file"
        if width > 1:
            _say(f"[{label}] {verdict} (exit {code}) in {secs:.1f} s")
        return label, verdict, code, secs

    # The slowest jobs first, so that the last one to start is a short one (measured on this 2-core CPU,
    # two at a time, ci profile, 2026-11-24: transformers:flex 273 s, tinygrad 186, torch:flex 138,
    # flax:linen-dpa-fp32-softmax 133, jax 116, transformers 114, flax 109, equinox 104, onnx 98,
    # tensorflow 97, torch 48, numpy 19; 727 s in all).
    slow_first = ["transformers:flex", "tinygrad", "torch:flex", "flax:linen-dpa-fp32-softmax", "jax", "transformers",
                  "flax", "equinox", "onnx", "tensorflow", "torch", "numpy"]
    todo.sort(key=lambda j: slow_first.index(j[1] or j[0]) if (j[1] or j[0]) in slow_first else len(slow_first))
    with ThreadPoolExecutor(max_workers=width) as pool:
        summary = list(pool.map(one, todo))
    files = sorted(str(p) for p in runs.glob(f"*-{args.device}.json"))
    merged = subprocess.run([sys.executable, "-m", "attnconf.reports", "merge", "--out", str(out), *files], cwd=ROOT)
    print(f"\nrun                 verdict                          exit   seconds   ({width} at a time)")
    for label, verdict, code, secs in summary:
        print(f"{label:<19} {verdict:<32} {code:>4} {secs:>9.1f}")
    print(f"{'all':<19} {'':<32} {'':>4} {time.time() - started:>9.1f}")
    print(f"\nmatrix: {out / 'README.md'}\nHTML:   {out / 'index.html'}")
    if merged.returncode:
        return merged.returncode
    # A verdict, NONCONFORMANT included, is what the report is for; a run that left no run file is an error.
    return max((1 for _, v, _, _ in summary if v in ("no run file", "unreadable run file")), default=0)


if __name__ == "__main__":
    sys.exit(main())
