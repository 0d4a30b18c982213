"""Compare two suite runs of one backend, before and after a change to how cases are drawn (the shape
palette of conformance/strategies/palette.py): the verdict, every cell's status and examples, what each run observed.

    python -m bench.palette_compare BEFORE.json AFTER.json [--shapes BEFORE.jsonl AFTER.jsonl]

The optional shape logs hold one JSON object per case run, {"shape": [B, Hq, Hkv, Lq, Lk, Dk, Dv],
"dtype": ..., "arrays": {name: shape}, "causal": ...} (and an {"exit": true, "tinygrad_programs": N} line):
the distinct shapes, and the distinct call signatures (shape, dtype, the shapes of masks, biases and lengths,
causal), are what a compile-per-shape implementation compiles. Exit status 1 if a verdict or a cell's
status differs, or a cell fell below the coverage floor.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def cells(run: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(c["implementation"], c["clause"], c["dtype"]): c for c in run["cells"]}


def shape_counts(path: Path) -> dict[str, Any]:
    """Cases, distinct shapes and distinct call signatures in a shape log, and tinygrad's compiled programs."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cases = [r for r in rows if "shape" in r]
    exits = [r for r in rows if r.get("exit")]
    signatures = {(tuple(r["shape"]), r["dtype"], json.dumps(r["arrays"], sort_keys=True), r["causal"]) for r in cases}
    return {"cases": len(cases), "shapes": len({tuple(r["shape"]) for r in cases}), "signatures": len(signatures),
            "tinygrad_programs": exits[-1].get("tinygrad_programs") if exits else None}


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], bool]:
    """Report lines and whether the two runs agree (same verdict, same cell statuses, floor kept)."""
    floor = after["verdict"].get("floor", 3)
    lines, same = [], True
    vb, va = before["verdict"], after["verdict"]
    for key in ("verdict", "failed_clauses", "divergences"):
        ok = vb.get(key) == va.get(key)
        same &= ok
        lines.append(f"{key}: {'same' if ok else 'DIFFERS'}: {vb.get(key)} -> {va.get(key)}")
    cb, ca = cells(before), cells(after)
    lines.append(f"cells: {len(cb)} -> {len(ca)}; statuses {dict(Counter(c['status'] for c in cb.values()))} -> "
                 f"{dict(Counter(c['status'] for c in ca.values()))}")
    lines.append(f"examples checked in all cells: {sum(c['checked'] for c in cb.values())} -> "
                 f"{sum(c['checked'] for c in ca.values())}")
    for k in sorted(set(cb) | set(ca)):
        b, a = cb.get(k), ca.get(k)
        if b is None or a is None or b["status"] != a["status"]:
            same = False
            lines.append(f"  cell {k}: {b and b['status']} -> {a and a['status']}")
        elif a["checked"] < min(floor, b["checked"]):
            same = False
            lines.append(f"  cell {k}: {b['checked']} -> {a['checked']} examples, under the floor {floor}")
    fewer = sum(1 for k in set(cb) & set(ca) if ca[k]["checked"] < cb[k]["checked"])
    lines.append(f"cells with fewer examples after: {fewer} (none under the floor {floor} that was at it before)"
                 if same else f"cells with fewer examples after: {fewer}")
    lines.append(f"duration_s: {before.get('duration_s')} -> {after.get('duration_s')}")
    return lines, same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--shapes", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    lines, same = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    if args.shapes:
        for tag, path in zip(("before", "after"), args.shapes):
            lines.append(f"{tag}: {shape_counts(path)}")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
