"""spec/BOUNDARIES.md, rendered from boundaries.py and the draw ranges of sizes.py (conformance/strategies/).

    python -m attnconf.conformance.strategies.boundaries_table
"""
from __future__ import annotations

from attnconf.conformance.strategies import sizes as sts
from attnconf.conformance.strategies.boundaries import BOUNDARIES, TEMPLATES
from attnconf.conformance.strategies.branch_cases import BRANCH_FAMILIES


def table() -> str:
    """spec/BOUNDARIES.md: every dimension's drawn range and the boundaries drawn to cross."""
    ranges = [
        ("B", f"{{1, 2, 3}} (budget shrinks it); boundary draws {sorted({b.shape['B'] for b in BOUNDARIES} - {1})}"),
        ("Hkv", "{1, 2, 3, 8}"),
        ("Hq / Hkv", f"{sts.GROUPS}; boundary draws up to 128 (MQA)"),
        ("Lq, Lk", f"{sts.SMALL_LENGTHS}, {sts.MEDIUM_LENGTHS}, {sts.LARGE_LENGTHS}; "
                   f"Lq in {sts.SHORT_QUERIES} against Lk in {sts.LONG_HISTORIES}; decode Lk to 4096"),
        ("Dk, Dv", f"{sts.HEAD_DIMS}; boundary draws the templates {TEMPLATES}, 257, (192, 128), (576, 512)"),
        ("page size", "paged_cases: drawn by the kvcache convention (see strategies.conventions.paged_cases)"),
        ("window", "window_cases: each side -1, 0, or up to Lk (strategies.windows.window_side)"),
    ]
    lines = ["# Shape boundaries", "",
             "Generated from conformance/strategies/boundaries.py (`python -m attnconf.conformance.strategies.boundaries_table`).",
             "Each boundary is a branch point of real kernels. Two things cross it: strategies.shapes() draws its shape with",
             "probability 1/8 (so the random cases of every family reach it by chance), and",
             "conformance/test_branch_points.py runs it in every family, by construction: "
             + ", ".join(BRANCH_FAMILIES) + " (conformance/strategies/branch_cases.py; under the dev and ci profiles",
             "each boundary and family once, in the implementation's dtypes in turn; under thorough, in every dtype).",
             "tests/test_boundaries.py counts the crossings of one ci run of the numpy reference, per family, and",
             "fails if a boundary is not crossed in every family (plain excepted for the GQA-packing boundaries).",
             "", "| dimension | drawn |", "|---|---|"]
    lines += [f"| {d} | {r} |" for d, r in ranges]
    lines += ["", "| boundary | dimension | at | kind | why | shape drawn |", "|---|---|---|---|---|---|"]
    for b in BOUNDARIES:
        shape = " ".join(f"{k}={v}" for k, v in b.shape.items())
        lines.append(f"| {b.id} | {b.dim} | {b.at} | {b.kind} | {b.why} | {shape} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from pathlib import Path

    (Path(__file__).resolve().parents[2] / "spec" / "BOUNDARIES.md").write_text(table())
