"""The README's table of bench/results.json: each measured time, its ratio to the floor, and issue 28's target.

`render(results)` returns the Markdown; `write_into(readme, table)` replaces what lies between the two
bench markers of the README (appending a section with them if the README has none). A part that was
not measured shows as "not measured" with the flag that measures it, never as a stale number.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

START = "<!-- bench:start (written by make bench: bench/bench_suite.py) -->"
END = "<!-- bench:end -->"
SECTION = "## Speed (make bench)"
# issue 28's targets on a 2-core machine (the first: a ratio to the floor; the others: wall seconds)
TARGET_FIRST_FAILURE_FLOORS = 1.5
TARGET_CERTIFY_S = 12.0
TARGET_EAGER_CI_S = 60.0
TARGET_COMPILING_CI_S = 90.0
TARGET_MAKE_TEST_S = 600.0
TARGET_MAKE_REPORT_S = 720.0


def render(results: dict[str, Any]) -> str:
    m = results.get("machine", {})
    floors = results.get("floor", {})
    torch_floor = floors.get("torch") or {}
    lines = [f"Measured {results.get('created', '?')} on {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
             f"{m.get('memory_gib', '?')} GiB, Python {m.get('python', '?')}; load average "
             f"{_load(m.get('load_average_at_start'))} at the start, {_load(m.get('load_average_at_end'))} at the end "
             f"(profile {results.get('profile', 'ci')}). Wall and CPU (user + system) seconds of whole processes, "
             "medians where repeated; × floor: the ratio to the floor's wall (CPU) seconds. On a machine shared "
             "with other jobs the CPU ratio is the one to read.",
             "", "| what | wall s | × floor | CPU s | × floor CPU | target | met |", "|---|---|---|---|---|---|---|"]
    for fw, f in sorted(floors.items()):
        lines.append(f"| floor: `python -c 'import {', '.join(f['imports'])}'` | {f['wall_s']:.2f} | 1.0 "
                     f"| {f['cpu_s']:.2f} | 1.0 | | |")
    cat = results.get("catalogue")
    bound = TARGET_FIRST_FAILURE_FLOORS
    if cat and cat.get("wall_s") is not None:
        sample = f", a sample: --bugs {cat['sample']}" if cat.get("sample") else ""
        lines.append(f"| catalogue, time to the first failure with -x, median over {cat['caught']} caught of "
                     f"{cat['total']} (each against its framework's floor{sample}) | {cat['wall_s']:.2f} | "
                     f"{cat['wall_floors']:.1f} | {cat['cpu_s']:.2f} | {cat['cpu_floors']:.1f} | ≤ {bound:g} × floor "
                     f"| {_yes(cat['wall_floors'] <= bound)} |")
        w = cat["worst"]
        lines.append(f"| catalogue, worst: `{w['kernel']}` | {w['wall_s']:.2f} | {w['wall_floors']:.1f} | "
                     f"{w['cpu_s']:.2f} | {w['cpu_floors']:.1f} | | |")
    else:
        lines.append(f"| catalogue, time to the first failure with -x | not measured | | | | ≤ {bound:g} × floor | |")
    lines.append(_row(f"`attnconf certify`, ci, a correct torch kernel ({(results.get('certify') or {}).get('verdict')}), "
                      "no stored baselines", results.get("certify"), torch_floor, TARGET_CERTIFY_S, "(--no-certify)"))
    if results.get("certify_warm"):
        lines.append(_row(f"the same again, its baselines stored by the first (ATTNCONF_BASELINE_CACHE; "
                          f"{results['certify_warm'].get('verdict')})", results["certify_warm"], torch_floor,
                          TARGET_CERTIFY_S, ""))
    backends = results.get("backends") or {}
    for name, b in sorted(backends.items()):
        compiling = b.get("compile_per_shape")
        lines.append(_row(f"ci run of {name} ({'compiles per shape' if compiling else 'eager'}, {b.get('verdict')})",
                          b, floors.get(name) or torch_floor,
                          TARGET_COMPILING_CI_S if compiling else TARGET_EAGER_CI_S, ""))
    if not backends:
        lines.append("| ci run of every installed backend | not measured (--all-backends) | | | | "
                     f"≤ {TARGET_EAGER_CI_S:g} s eager, ≤ {TARGET_COMPILING_CI_S:g} s compiling | |")
    fresh = results.get("fresh_clone") or {}
    for target, limit, flag in (("make test", TARGET_MAKE_TEST_S, "(--make-test)"),
                                ("make report", TARGET_MAKE_REPORT_S, "(--make-report)")):
        lines.append(_row(f"{target}, fresh clone", fresh.get(target), torch_floor, limit, flag))
    return "\n".join(lines) + "\n"


def _row(what: str, row: dict[str, Any] | None, floor: dict[str, Any], bound: float, flag: str) -> str:
    if not row:
        return f"| {what} | not measured {flag} | | | | ≤ {bound:g} s | |"
    wall, cpu = row["wall_s"], row.get("cpu_s")
    return (f"| {what} | {wall:.1f} | {_ratio(wall, floor.get('wall_s'))} | {cpu:.1f} | "
            f"{_ratio(cpu, floor.get('cpu_s'))} | ≤ {bound:g} s | {_yes(wall <= bound)} |")


def _ratio(value: float | None, floor: float | None) -> str:
    return "" if value is None or not floor else f"{value / floor:.1f}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _load(values) -> str:
    return "/".join(f"{v:.1f}" for v in values) if values else "?"


def write_into(readme: Path, table: str) -> None:
    """Replace the table between the markers, or append the section with its markers."""
    text = readme.read_text()
    block = f"{START}\n{table}{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    readme.write_text(text)
