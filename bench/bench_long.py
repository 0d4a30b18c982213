"""What ATTN-LONG-1 costs on CPU: time and memory of each stage at each length (issue 25, item 2).

    .venv/bin/python bench/bench_long.py [--lengths 4097,16385,32769] [--dtypes float32,bfloat16]
                                         [--output bench/long.json]

Per (length, dtype), in a fresh subprocess so that each peak is its own: building the sharp-key case
(conformance/strategies/long_cases.py), the kernel (torch's scaled_dot_product_attention, causal, and the blocked
control of tests/kernels/long_bugs.py), the float64 reference on the sampled rows (reference/tiled.py
rows_case) and the judgement with its emulated baseline (conformance/engine/tolerance.py). Times are wall
seconds on a shared machine (noisy); memory is the NumPy peak seen by tracemalloc per stage and the
process's peak resident size after each stage (torch's allocator is invisible to tracemalloc).
Nothing here is asserted: the numbers go to the output file and the README.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAGES = r'''
import json, resource, sys, time, tracemalloc
import numpy as np, torch
from attnconf.conformance.strategies.long_cases import long_case, sampled_rows
from attnconf.conformance.engine.tolerance import judge_output
from attnconf.reference import oracle
from attnconf.reference.tiled import rows_case
from tests.kernels.long_bugs import long_control
length, dtype = int(sys.argv[1]), sys.argv[2]
out = {"length": length, "dtype": dtype}
def stage(name, fn):
    tracemalloc.start(); t = time.perf_counter(); r = fn(); dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    out[name] = {"seconds": round(dt, 2), "numpy_peak_mib": round(peak / 2**20, 1),
                 "process_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    return r
rng = np.random.default_rng(length)
rows = sampled_rows(length, rng)
case = stage("build_case", lambda: long_case(length, dtype, rng, rows))
q, k, v = (torch.tensor(x, dtype=getattr(torch, dtype)) for x in (case.q, case.k, case.v))
sdpa = stage("torch_sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
stage("blocked_control", lambda: long_control(q, k, v, is_causal=True))
sub = stage("reference_rows", lambda: (lambda s: (oracle(s), s))(rows_case(case, rows))[1])
j = stage("judge_with_baseline", lambda: judge_output(sdpa.double().numpy()[:, :, rows], sub))
out["sdpa_ok"], out["sdpa_ratio"], out["allowed_max"] = bool(j.ok), float(j.ratio_max), float(j.allowed_max)
print(json.dumps(out))
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4097,16385,32769")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--output", default=str(ROOT / "bench" / "long.json"))
    args = ap.parse_args(argv)
    results = []
    for length in (int(n) for n in args.lengths.split(",")):
        for dtype in args.dtypes.split(","):
            proc = subprocess.run([sys.executable, "-c", STAGES, str(length), dtype], cwd=ROOT, capture_output=True,
                                  text=True)
            if proc.returncode:
                results.append({"length": length, "dtype": dtype, "error": proc.stderr.strip().splitlines()[-1:]})
            else:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
            Path(args.output).write_text(json.dumps(results, indent=1) + "\n")   # a run never loses what it has
    return 0


if __name__ == "__main__":
    sys.exit(main())
