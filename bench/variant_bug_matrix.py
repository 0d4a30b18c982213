"""Which variant properties catch which variant bug: every bug of tests/kernels/variant_bugs.py against the
window/softcap/ALiBi/sink/lse/decode properties, without -x, so each property's power shows (a property that
no bug fails would be a property that cannot fail).

    .venv/bin/python -m bench.variant_bug_matrix [--profile ci] [--out FILE.json] [NAME ...]

Prints one line per kernel: the failing tests (the clause of each in brackets) and the wall time.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.runner import run_suite
from tests.kernels import variant_bugs

SELECT = "window or softcap or alibi or sink or lse or decode"


def failures(report: dict | None) -> list[str]:
    out = []
    for rec in (report or {}).get("records", []):
        if rec.get("status") in ("fail", "error"):
            clause = (rec.get("clauses") or ["?"])[0]
            msg = rec.get("message") or ""
            if msg.startswith("[") or "] " in msg:
                clause = msg[msg.index("[") + 1:msg.index("]")] if "[" in msg else clause
            out.append(f"{rec.get('test')}[{clause}]")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    names = args.names or ["correct", *sorted(variant_bugs.BUGS)]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            run = run_suite("numpy", Path(tmp) / f"{name}.json", kernel=f"tests.kernels.variant_bugs:{name}",
                            profile=args.profile, extra=("-k", SELECT))
            fails = failures(run.report)
            rows[name] = {"failed": fails, "wall_s": round(run.wall_s, 1), "returncode": run.returncode}
            print(f"{name}: {len(fails)} failing ({run.wall_s:.0f} s): {', '.join(fails) or '-'}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
