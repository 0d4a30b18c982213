"""The shape boundaries of conformance/strategies/boundaries.py: declared once, documented from the declaration, crossed.

Fast: spec/BOUNDARIES.md is what `boundaries_table.table()` renders, and each boundary's drawn shape crosses it.
Slow: one ci run of the numpy reference with ATTNCONF_BOUNDARY_LOG set counts, per boundary and per family
(plain, sinks, ALiBi, windows, GQA, gradients), the cases that crossed it; every boundary must be crossed in
every family (but plain, for the GQA-packing boundaries, which are grouped by definition):
conformance/test_branch_points.py makes it so by construction, and this test measures it.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnconf.conformance.strategies import boundaries, boundaries_table

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_table_is_rendered_from_the_declaration():
    assert (ROOT / "spec" / "BOUNDARIES.md").read_text() == boundaries_table.table(), \
        "spec/BOUNDARIES.md is stale: python -m attnconf.conformance.strategies.boundaries_table"


@pytest.mark.parametrize("b", boundaries.BOUNDARIES, ids=lambda b: b.id)
def test_each_boundary_shape_crosses_its_boundary(b):
    assert b.crossed(b.shape)
    s = b.shape
    assert s["Hq"] % s["Hkv"] == 0


def crossings(log: Path) -> dict[str, collections.Counter]:
    """Boundary id -> Counter of families over the cases the log recorded."""
    out: dict[str, collections.Counter] = {b.id: collections.Counter() for b in boundaries.BOUNDARIES}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        for bid in rec["crossed"]:
            out[bid].update(rec["families"])
    return out


@pytest.mark.slow
def test_one_ci_run_crosses_every_boundary(tmp_path):
    log = tmp_path / "boundaries.jsonl"
    log.touch()
    env = {**os.environ, boundaries.LOG_ENV: str(log)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", "--backend=numpy", "-q", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--hypothesis-profile=ci", f"--report={tmp_path / 'run.json'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:]
    seen = crossings(log)
    for bid, fams in seen.items():
        print(f"{bid:16s} " + " ".join(f"{f}={fams.get(f, 0)}" for f in boundaries.FAMILIES))
    missing = [f"{bid} in {f}" for bid, fams in seen.items() for f in boundaries.FAMILIES
               if not fams.get(f) and not (f == "plain" and boundaries.BY_ID[bid].dim == "group")]
    assert not missing, f"boundaries no case of the ci run crossed, by family: {missing}"
