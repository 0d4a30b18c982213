"""Merging run files: matrix cells, columns, divergences and the pairwise panel agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnconf.reports import merge, runfile
from attnconf.reports.merge import Column, ImplKey
from tests.test_reports_fixtures import FIXTURES, GOOD, b64, numpy_cpu, torch_cpu, upgrade


@pytest.fixture(scope="module")
def report() -> merge.Report:
    runs = [runfile.load(FIXTURES / n) for n in GOOD]
    return merge.build(runs, [str(FIXTURES / n) for n in GOOD])


def col(impl: str, device: str, dtype: str) -> Column:
    return Column(ImplKey(impl, device), dtype)


def test_columns_are_impl_device_dtype(report: merge.Report) -> None:
    assert col("numpy:naive", "cpu", "float16") in report.columns
    assert col("torch:sdpa-math", "cpu", "bfloat16") in report.columns
    assert col("jax:xla", "cpu", "float64") not in report.columns  # no jax record used float64


def test_cells(report: merge.Report) -> None:
    cell = report.cells[("ATTN-OP-1", col("numpy:naive", "cpu", "float16"))]
    assert (cell.state, cell.ratio) == ("conformant", 0.61)
    # a failing record marks every dtype column of its implementation
    failing = report.cells[("ATTN-GQA-1", col("torch:sdpa-efficient", "cpu", "float32"))]
    assert failing.state == "failing" and failing.ratio == 12.5
    assert failing.notable_records[0]["replay"].startswith(".venv/bin/python")
    # a record with ratios only for float32 leaves the bfloat16 column unrun
    assert ("ATTN-GQA-1", col("torch:sdpa-math", "cpu", "bfloat16")) not in report.cells
    div = report.cells[("ATTN-EMPTY-1", col("torch:sdpa-math", "cpu", "any"))]
    assert div.state == "divergent" and div.divergences == ["TORCH-EMPTY-NAN"]
    # a passing record that carried divergent examples is divergent, not conformant
    assert report.cells[("ATTN-EMPTY-1", col("jax:xla", "cpu", "any"))].state == "divergent"
    unsupported = report.cells[("ATTN-DROP-1", col("numpy:naive", "cpu", "any"))]
    assert unsupported.state == "unsupported" and unsupported.unsupported_reasons == ["numpy:naive lacks dropout"]


def test_worst_state_wins() -> None:
    cell = merge.Cell()
    rec = {"status": "pass"}
    cell.add("conformant", rec, 0.5)
    cell.add("unsupported", {"status": "unsupported"}, None)
    assert cell.state == "conformant"
    cell.add("failing", {"status": "fail"}, math.nan)
    cell.add("divergent", {"status": "divergent"}, 0.1)
    assert cell.state == "failing" and math.isnan(cell.ratio)


def test_groups_follow_clauses_toml(report: merge.Report) -> None:
    groups = [g for g, _ in report.groups]
    assert groups.index("operation") < groups.index("masks") < groups.index("tolerance")
    titles = {c.id: c.title for c in report.clauses}
    assert titles["ATTN-OP-1"] == "Definition"


def test_divergences_merge_spec_and_runs(report: merge.Report) -> None:
    ids = [d["id"] for d in report.divergences]
    assert ids == ["JAX-EMPTY-MEAN", "TORCH-EMPTY-NAN"]
    torch_div = report.divergences[1]
    assert torch_div["runs"][0]["witness"] == "diverges as declared"


def test_duplicate_run_ids_refused() -> None:
    run = numpy_cpu()
    with pytest.raises(runfile.RunFileError, match="run_id"):
        merge.build([run, run], ["a.json", "b.json"])


def test_unknown_clause_is_kept(tmp_path) -> None:
    run = numpy_cpu()
    run["records"][0]["clauses"] = ["ATTN-NEW-1"]
    report = merge.build([run], spec_dir=tmp_path)  # an empty spec folder
    assert [c.id for c in report.clauses] == ["ATTN-NEW-1", "ATTN-MASK-1", "ATTN-EMPTY-1", "ATTN-DROP-1"]


# pairwise agreement -------------------------------------------------------------------------


def test_agreement_rule() -> None:
    a = np.array([1.0, 2.0, -np.inf])
    assert merge.panel_agreement(a, 1e-3, a + [1e-3, 0, 0], 1e-3)[0]
    assert not merge.panel_agreement(a, 1e-3, a + [3e-3, 0, 0], 1e-3)[0]
    nan = np.array([np.nan, 1.0])
    assert merge.panel_agreement(nan, 0.0, nan.copy(), 0.0)[0]  # NaN agrees with NaN in the same place
    ok, detail = merge.panel_agreement(nan, 1.0, np.array([1.0, np.nan]), 1.0)
    assert not ok and "NaN" in detail
    assert not merge.panel_agreement(np.array([np.nan]), 1.0, np.array([0.0]), 1.0)[0]
    assert not merge.panel_agreement(np.zeros(2), 1.0, np.zeros(3), 1.0)[0]
    assert not merge.panel_agreement(np.array([np.inf]), 1.0, np.array([1e300]), 1.0)[0]


def test_pairs(report: merge.Report) -> None:
    pairs = {(p.a.implementation, p.b.implementation): p for p in report.pairs}
    both = pairs[("numpy:naive", "torch:sdpa-math")]
    assert (both.agree, both.total, both.agrees) == (3, 3, True)  # P03 has NaN at the same place in both
    eff = pairs[("numpy:naive", "torch:sdpa-efficient")]
    assert (eff.agree, eff.total) == (1, 2)  # P03 unsupported there: not counted
    assert [d["case"] for d in eff.disagreements] == ["P02"]
    jax = pairs[("jax:xla", "numpy:naive")]
    assert (jax.agree, jax.total) == (2, 3) and "NaN" in jax.disagreements[0]["detail"]


def test_corrupt_panel_output_is_a_run_file_error() -> None:
    run = torch_cpu()
    run["panel"]["torch:sdpa-math"][0]["out_b64"] = b64(np.zeros(3))
    with pytest.raises(runfile.RunFileError, match="do not hold float64"):
        merge.build([run], ["t.json"])


def test_cells_come_from_the_run_file() -> None:
    """The report shows each run's own cells (decided once, by conformance/engine/verdict.py), never re-derived."""
    run = upgrade(torch_cpu())
    cell = next(c for c in run["cells"] if c["clause"] == "ATTN-GQA-1" and c["implementation"] == "torch:sdpa-efficient")
    cell["status"] = "below_floor"
    report = merge.build([run])
    key = ("ATTN-GQA-1", col("torch:sdpa-efficient", "cpu", cell["dtype"]))
    assert report.cells[key].state == "below_floor" and report.cells[key].checked == cell["checked"]
