"""ATTN-LONG-1 means it: long-only buggy kernels are caught, the blocked control passes (issue 25, item 2).

Fast: the sampled rows of a long case, as their own masked Case (reference/tiled.py rows_case), give
the whole case's reference rows and yardstick; the long inputs put most of each row's weight on a few
keys, so the mean of V, or a flattened softmax, is far from the answer.
Long (`make test-long`): `pytest conformance --backend=torch --kernel=... --long -k test_long_sequences`
fails each kernel of tests/kernels/long_bugs.py on ATTN-LONG-1 and passes `long_control` (minutes each).
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from attnconf.conformance.strategies.long_cases import ALIAS_AT, long_case, sampled_rows
from attnconf.reference import Case, baseline_error, oracle
from attnconf.reference.tiled import rows_case
from attnconf.spec.vocabulary import ALIGNMENTS

HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("causal", (None, *ALIGNMENTS))
def test_rows_case_gives_the_whole_cases_rows(causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 2, n, 16)) for n in (30, 28, 28))
    case = Case.build(q, k, v, dtype="float16", causal=causal, kv_lengths=[28, 20], q_lengths=[30, 15], softcap=3.0)
    rows = [0, 1, 14, 15, 29]
    sub = rows_case(case, rows)
    assert np.array_equal(np.nan_to_num(oracle(case).out[:, :, rows]), oracle(sub).out)
    np.testing.assert_allclose(baseline_error(sub)[0], baseline_error(case)[0][:, :, rows], rtol=0, atol=1e-12)


def test_rows_case_refuses_position_dependent_features():
    rng = np.random.default_rng(1)
    case = Case.build(*(rng.normal(size=(1, 2, 8, 4)) for _ in range(3)), alibi_slopes=np.ones(2))
    with pytest.raises(ValueError, match="alibi_slopes"):
        rows_case(case, [0, 1])


def test_long_rows_hang_on_a_few_keys():
    """At L = 4097 every sampled row puts at least half its weight on its 4 largest keys, and the answer is
    far from the mean of the visible values (what a flattened softmax returns)."""
    length = 4097
    rng = np.random.default_rng(length)
    rows = sampled_rows(length, rng)
    assert {0, length - 1, length - 2, 4095, 4096} <= set(rows.tolist()) and len(rows) == 64
    ref = oracle(rows_case(long_case(length, "float32", rng, rows), rows))
    w = ref.weights[0, 0]
    assert np.sort(w, axis=-1)[:, -4:].sum(axis=-1).min() > 0.5
    case = long_case(length, "float32", np.random.default_rng(length), rows)
    means = np.cumsum(case.v[0, 0], axis=0)[rows] / (rows + 1)[:, None]
    assert np.abs(ref.out[0, 0] - means).max(axis=-1)[1:].min() > 0.3


def test_keys_past_the_alias_point_are_sharp():
    length = 16385 + 2048
    rng = np.random.default_rng(length)
    rows = sampled_rows(length, rng)
    case = long_case(length, "float32", rng, rows)
    k = case.k[0, 0]
    assert (np.abs(k[ALIAS_AT:ALIAS_AT + 2048]).max(axis=-1) > 8).sum() >= 64


CASE_TIMEOUT_S = 1800     # one call at L = 32769 in float64 takes minutes on a shared 2-core machine
LONG_BUGS = ("long_scale_1_over_d", "long_positions_alias", "long_one_future_key", "long_uniform_mean",
             "long_last_4096_keys")


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(not HAS_TORCH, reason="the long catalogue is written in torch")
@pytest.mark.parametrize("name", LONG_BUGS + ("long_control",))
def test_long_suite_judges_long_kernel(name, tmp_path):
    from bench.runner import run_suite

    bug = name != "long_control"
    run = run_suite("torch", tmp_path / "run.json", kernel=f"tests.kernels.long_bugs:{name}", stop_at_first=bug,
                    extra=("--long", "-k", "test_long_sequences", f"--case-timeout={CASE_TIMEOUT_S}"), timeout_s=3600)
    assert run.report is not None, run.output_tail
    if bug:
        assert run.returncode == 1, f"the suite did not catch {name}:\n{run.output_tail}"
        assert "ATTN-LONG-1" in (run.first_failure or {}).get("clauses", []) or \
            "ATTN-LONG-1" in str((run.first_failure or {}).get("message")), run.first_failure
        print(f"{name}: caught by {run.caught_by} in {run.wall_s:.0f} s")
    else:
        assert run.first_failure is None and run.returncode in (0, 2) and \
            run.report["verdict"]["verdict"] != "NONCONFORMANT", f"{name} failed: {run.first_failure}\n{run.output_tail}"
