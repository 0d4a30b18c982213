"""What the ONNX adapters' graph cache saves: the same cases run with one session per signature
(the adapters' behaviour) and with a fresh model and session per call.

    .venv/bin/python -m attnconf.bench.onnx_graph_cache [--cases 120] [--impl onnx:ort-attention]

Cases are drawn like the suite's ordinary ones (small shapes, masks, causal alignments, padding,
GQA, custom scales) from a fixed seed; each implementation runs only the cases it supports. Prints,
per implementation: calls, distinct signatures, seconds building (model + session) and running,
with and without the cache. Timings on a shared machine are noisy; the counts are exact.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from attnconf import adapters
from attnconf.reference import Case
from attnconf.spec.vocabulary import ALIGNMENTS


def draw_cases(n: int, seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(n):
        B, hkv = int(rng.integers(1, 3)), int(rng.choice([1, 2]))
        hq = hkv * int(rng.choice([1, 2]))
        lq, lk = (int(x) for x in rng.choice([1, 3, 5, 8, 17, 33], size=2))
        d = int(rng.choice([8, 16, 32]))
        params: dict = {"dtype": str(rng.choice(["float32", "float16"]))}
        kind = rng.integers(0, 6)
        if kind == 1:
            params["mask"] = rng.random((B, 1, lq, lk)) < 0.7
        elif kind == 2:
            params["causal"] = str(rng.choice(ALIGNMENTS))
        elif kind == 3:
            params["kv_lengths"] = rng.integers(lq if lk >= lq else 0, lk + 1, size=B)
            params["causal"] = "bottom_right"
        elif kind == 4:
            params["bias"] = rng.normal(size=(1, hq, lq, lk))
        if rng.random() < 0.3:
            params["scale"] = float(rng.choice([0.1, 0.25, 0.5]))   # a few values: signatures recur
        q, k, v = rng.normal(size=(B, hq, lq, d)), rng.normal(size=(B, hkv, lk, d)), rng.normal(size=(B, hkv, lk, d))
        cases.append(Case.build(q, k, v, **params))
    return cases


def _cached(impl, calls) -> tuple[float, float, int]:
    cache: dict = {}
    t_build = t_run = 0.0
    for call in calls:
        key = call.signature()
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = impl.build(call)
            t_build += time.perf_counter() - t0
        t0 = time.perf_counter()
        impl.execute(cache[key], call)
        t_run += time.perf_counter() - t0
    return t_build, t_run, len(cache)


def _uncached(impl, calls) -> tuple[float, float]:
    t_build = t_run = 0.0
    for call in calls:
        t0 = time.perf_counter()
        obj = impl.build(call)
        t_build += time.perf_counter() - t0
        t0 = time.perf_counter()
        impl.execute(obj, call)
        t_run += time.perf_counter() - t0
    return t_build, t_run


def measure(impl, cases: list[Case], repeats: int = 3) -> dict:
    """Best of `repeats` for each way (after one warm-up pass of each), so import and first-call costs
    and the machine's load spikes weigh as little as possible."""
    calls = [impl.call_for(c) for c in cases if impl.supports(c) is True]
    _cached(impl, calls[:5])
    _uncached(impl, calls[:5])
    cached = min((_cached(impl, calls) for _ in range(repeats)), key=lambda r: r[0] + r[1])
    uncached = min((_uncached(impl, calls) for _ in range(repeats)), key=lambda r: r[0] + r[1])
    return {"calls": len(calls), "signatures": cached[2], "cached_build_s": cached[0], "cached_run_s": cached[1],
            "uncached_build_s": uncached[0], "uncached_run_s": uncached[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=120)
    ap.add_argument("--impl", default=None, help="comma-separated implementations (default: all)")
    args = ap.parse_args(argv)
    cases = draw_cases(args.cases)
    for impl in adapters.load("onnx", impl=args.impl):
        m = measure(impl, cases)
        cached = m["cached_build_s"] + m["cached_run_s"]
        uncached = m["uncached_build_s"] + m["uncached_run_s"]
        per_build = m["uncached_build_s"] / max(m["calls"], 1)
        print(f"{impl.name}: {m['calls']} calls, {m['signatures']} signatures; build {per_build * 1e3:.1f} ms per graph, "
              f"run {m['cached_run_s'] / max(m['calls'], 1) * 1e3:.2f} ms per call; "
              f"cached {cached:.2f} s, uncached {uncached:.2f} s (saves {uncached - cached:.2f} s, "
              f"{uncached / max(cached, 1e-9):.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
