"""The bug-finding power of the shape palette: every buggy kernel of the catalogue run through the suite's
generated cases (`-x`, the pinned first-look cases deselected, so that only drawn shapes can catch it), once
drawing freely and once with every implementation on the palette (ATTNCONF_PALETTE=1, conformance/strategies/palette.py).

    python -m bench.palette_catalogue [--out FILE] [MODULE ...]     (default: tests.kernels.buggy)

Prints, per kernel, whether each mode caught it, the test that did and after how many examples; exit
status 1 if the palette misses a bug that free draws catch.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.runner import run_suite
from attnconf.conformance.strategies.palette import ENV


def _one(kernel: str, mode: str, tmp: Path) -> dict[str, object]:
    os.environ[ENV] = mode
    try:
        run = run_suite("torch", tmp / f"{mode}.json", kernel=kernel, stop_at_first=True,
                        extra=("-k", "not test_first_look"))
    finally:
        os.environ.pop(ENV, None)
    f = run.first_failure or {}
    return {"caught": run.returncode == 1, "by": (run.caught_by or "").split("::")[-1].split("[")[0],
            "examples": f.get("examples"), "wall_s": round(run.wall_s, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", default=["tests.kernels.buggy"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows, missed = [], 0
    with TemporaryDirectory() as tmp:
        for module in args.modules:
            for name in sorted(importlib.import_module(module).BUGS):
                kernel = f"{module}:{name}"
                free, pal = _one(kernel, "0", Path(tmp)), _one(kernel, "1", Path(tmp))
                missed += bool(free["caught"] and not pal["caught"])
                rows.append({"kernel": kernel, "free": free, "palette": pal})
                print(f"{kernel}: free {free}  palette {pal}", flush=True)
    caught = [sum(r[m]["caught"] for r in rows) for m in ("free", "palette")]
    print(f"caught without pins: free draws {caught[0]}/{len(rows)}, palette {caught[1]}/{len(rows)}; "
          f"missed by the palette only: {missed}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "caught": caught, "missed_by_palette": missed}, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
