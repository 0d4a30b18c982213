"""No flakes: each backend's `ci` profile under N different Hypothesis seeds.

A correct backend must end CONFORMANT or CONFORMANT_WITH_DIVERGENCES under every
seed. Writes bench/flakes.json: per backend and seed, exit status, verdict,
wall time and any failing records.

    .venv/bin/python bench/flake_check.py --seeds 10 [--backends numpy,torch]   # default: every installed backend
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnconf.adapters import available_backends  # noqa: E402
from attnconf.spec.vocabulary import FAILING  # noqa: E402
from bench.runner import ROOT, run_suite  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--seed-list", default=None, help="comma-separated seeds (instead of 1..--seeds)")
    p.add_argument("--backends", default=",".join(available_backends()))
    p.add_argument("--out", default=str(ROOT / "bench" / "flakes.json"))
    args = p.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    tmp = ROOT / ".attnconf-ci" / "flakes"
    tmp.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        seeds = [int(x) for x in args.seed_list.split(",")] if args.seed_list else range(1, args.seeds + 1)
        for seed in seeds:
            run = run_suite(backend, tmp / f"{backend}-{seed}.json", extra=(f"--hypothesis-seed={seed}",
                                                                             f"--failures-dir={tmp / 'failures'}"),
                            in_process=False)
            verdict = (run.report or {}).get("verdict", {}).get("verdict", "no run file")
            fails = [{"nodeid": r["nodeid"], "message": r["message"], "case": r["case"]}
                     for r in (run.report or {}).get("records", []) if r["status"] in FAILING]
            results.setdefault(backend, {})[str(seed)] = {"exit": run.returncode, "verdict": verdict,
                                                          "wall_s": round(run.wall_s, 1), "failures": fails}
            print(f"{backend} seed {seed}: exit {run.returncode} {verdict} {run.wall_s:.0f} s", flush=True)
            out.write_text(json.dumps(results, indent=1))
    flaky = {b: [s for s, r in v.items() if r["exit"] != 0] for b, v in results.items()}
    print("runs with failures:", flaky)
    return 0


if __name__ == "__main__":
    sys.exit(main())
