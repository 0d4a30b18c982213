"""bench/bench_table.py: the README's speed table says what was measured, against the floor, and what was not."""
from __future__ import annotations

from bench import bench_table

FLOOR = {"imports": ["torch", "numpy", "hypothesis", "pytest"], "wall_s": 2.0, "cpu_s": 1.5}
RESULTS = {
    "created": "2026-11-28T15:00:00+0000", "profile": "ci",
    "machine": {"cpu": "Test CPU", "cores": 2, "memory_gib": 8, "python": "3.11",
                "load_average_at_start": [1, 1, 1], "load_average_at_end": [2, 2, 2]},
    "floor": {"torch": FLOOR},
    "catalogue": {"caught": 2, "total": 2, "wall_s": 2.5, "cpu_s": 2.0, "wall_floors": 1.25, "cpu_floors": 1.33,
                  "worst": {"kernel": "tests.kernels.buggy:x", "wall_s": 5.0, "cpu_s": 4.0, "wall_floors": 2.5,
                            "cpu_floors": 2.67}},
    "certify": {"wall_s": 14.0, "cpu_s": 12.0, "verdict": "CONFORMANT"},
}


def test_the_table_gives_ratios_to_the_floor_and_judges_each_target():
    table = bench_table.render(RESULTS)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    first = next(line for key, line in rows.items() if key.startswith("catalogue, time to the first failure"))
    assert "| 1.2 |" in first and first.endswith("| yes |")          # 2.5 s / 2.0 s, within 1.5 x the floor
    certify = next(line for key, line in rows.items() if key.startswith("`attnconf certify`"))
    assert "| 14.0 | 7.0 | 12.0 | 8.0 |" in certify and certify.endswith("| no |")    # over 12 s
    assert "not measured (--make-test)" in table and "not measured (--all-backends)" in table
    assert "Test CPU, 2 cores" in table


def test_the_table_replaces_its_own_section_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nText.\n")
    bench_table.write_into(readme, "| a |\n")
    bench_table.write_into(readme, "| b |\n")
    text = readme.read_text()
    assert text.startswith("# Project\n\nText.\n") and text.count(bench_table.SECTION) == 1
    assert "| b |" in text and "| a |" not in text
