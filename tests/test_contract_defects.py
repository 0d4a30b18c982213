"""The smaller defects of issue 24, each with its test: error ratios in the summary, replay commands and
`attnconf replay` options, Hypothesis' storage under `attnconf certify`, strides in a saved case, the W-1
message on NaN weights, and ATTN-ARG-1's NaN-aware row comparison."""
from __future__ import annotations

import json

import numpy as np

from attnconf import cli
from attnconf.conformance.engine import plugin
from attnconf.conformance.engine import harness
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.test_weights import weight_sign_problem
from attnconf.reference import Case


def test_summary_ratio_keeps_large_and_non_finite_ratios():
    recs = [{"implementation": "k", "ratios": {"float32": {"max": 0.004}}},
            {"implementation": "k", "ratios": {"float32": {"max": 1.75e6}}},
            {"implementation": "k", "ratios": {"float16": {"max": float("inf")}}}]
    tail = plugin.ratio_tail(recs, "k")
    assert "float32 1.75e+06" in tail and "float16 inf" in tail and "0.00" not in tail


def test_a_nan_judgement_is_kept_as_the_worst_ratio():
    from attnconf.conformance.engine import tolerance as T

    q = np.ones((1, 1, 2, 4))
    case = Case.build(q, q, q, dtype="float32")
    rec = harness.TestRecord("n", "t", [], "k")
    rec.add_judgement(T.judge_output(np.full(case.out_shape, np.nan), case), case)
    assert rec.ratios["float32"]["max"] == float("inf")


def test_replay_takes_divergences_dir_and_capabilities():
    args = cli.parser().parse_args(["replay", "x.npz", "--backend", "torch", "--kernel", "m:f", "--capabilities",
                                    "c.toml", "--divergences-dir", "d", "--test", "test_x.py::t"])
    got = cli._backend_args(args)
    assert "--capabilities=c.toml" in got and "--divergences-dir=d" in got and "--kernel=m:f" in got
    # the same options in another order parse the same
    again = cli.parser().parse_args(["replay", "--divergences-dir", "d", "--backend", "torch", "x.npz"])
    assert again.case == "x.npz" and again.divergences_dir == "d"


def test_certify_keeps_hypothesis_storage_out_of_the_callers_folder(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, cwd, env):
        seen.update(env=env, cwd=cwd)

        class R:
            returncode = 0
        return R()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    cli.run_suite(["-q"])
    storage = seen["env"]["HYPOTHESIS_STORAGE_DIRECTORY"]
    assert not storage.startswith(str(tmp_path)) and not (tmp_path / ".hypothesis").exists()


def test_saved_case_states_its_strides(tmp_path):
    q = np.ones((2, 3, 4, 5))
    for layout, k_strides in (("contiguous", [60, 20, 5, 1]), ("noncontiguous", [60, 5, 15, 1]),
                              ("broadcast_kv", [0, 20, 5, 1])):
        case = Case.build(q, q, q, layout=layout)
        path = case.save(tmp_path / f"{layout}.npz")
        with np.load(path) as data:
            assert json.loads(str(data["strides"]))["k"] == k_strides
        assert Case.load(path).digest() == case.digest()


def test_w1_names_nan_weights_as_nan():
    w = np.array([[0.5, np.nan], [0.25, 0.75]])
    assert "NaN" in weight_sign_problem(w) and "negative" not in weight_sign_problem(w)
    assert weight_sign_problem(np.array([0.5, -0.1])).startswith("negative weight -0.1")


def test_arg1_a_nan_row_never_counts_as_unmoved():
    ref = np.zeros((1, 1, 2, 3))
    out = ref.copy()
    out[0, 0, 1] = np.nan
    d = max_gap(out, ref, axis=-1, nan_equal=False)
    assert d[0, 0, 0] == 0 and d[0, 0, 1] == np.inf
    assert max_gap(out, ref, nan_equal=False) == np.inf
    assert max_gap(out, out, nan_equal=False) == np.inf      # NaN against NaN: the row moved, never stayed


def test_runs_started_by_the_cli_name_tests_from_the_suite_folder():
    from pathlib import Path
    from types import SimpleNamespace

    assert plugin._by_cli(SimpleNamespace(inipath=Path("/x/attnconf/conformance/pytest-attnconf.ini")))
    assert not plugin._by_cli(SimpleNamespace(inipath=Path("/repo/pyproject.toml")))
    assert not plugin._by_cli(SimpleNamespace(inipath=None))
    assert (Path(cli.suite_ini()).name == plugin.SUITE_INI)
