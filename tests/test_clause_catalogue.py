"""The clause-by-clause proof (issue 25): every normative clause has a catalogue kernel the suite catches on it.

Fast layer: every normative clause of spec/clauses.toml has at least one one-defect kernel in the catalogue
(tests/kernels/by_clause.py gathers them from the kernels' `.clause`), every catalogue kernel names a
normative clause, and each kernel of tests/kernels/clause_bugs.py differs from the reference on a witness
case in the quantity its defect touches (so a miss is the suite's gap, not a dud bug).

Slow layer: for each normative clause, the suite restricted to the conformance tests that cite the clause
(`-k`) runs on that clause's first kernel with `-x`; it must end NONCONFORMANT, and the failing test cites
the clause. bench/clause_proof.py runs the same and records the seconds to catch (spec/PROOF.md).
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconf import spec
from attnconf.reference import Case, backward, oracle
from bench.clause_proof import NO_KERNEL_FORM, proof_run
from tests.kernels import by_clause, clause_bugs


def test_every_normative_clause_has_a_catalogue_kernel():
    if "buggy" not in by_clause.available():
        pytest.skip("the torch catalogues are not importable")
    have = by_clause.kernels_by_clause()
    missing = [c for c in spec.normative() if c not in have and c not in NO_KERNEL_FORM]
    assert not missing, f"normative clauses without a one-defect catalogue kernel: {missing}"
    assert set(NO_KERNEL_FORM) <= set(spec.normative())


def test_the_measured_proof_shows_every_normative_clause_caught():
    """bench/clause_proof.json (`python -m bench.clause_proof`, or the slow test below) records, for each
    normative clause, a catalogue kernel of that clause that the tests citing it caught."""
    import json

    from bench.clause_proof import OUT

    runs = json.loads(OUT.read_text())["clauses"]
    kernels = {k.spec: k.clause for k in by_clause.kernels()}
    bad = {c: runs.get(c) for c in spec.normative() if c not in NO_KERNEL_FORM
           and not (runs.get(c, {}).get("caught") and kernels.get(runs[c]["kernel"], c) == c)}
    assert not bad, f"normative clauses the measured proof does not show caught: {sorted(bad)}"


def test_every_catalogue_kernel_names_a_normative_clause_some_test_cites():
    normative, cited = set(spec.normative()), by_clause.tests_citing()
    wrong = {k.spec: k.clause for k in by_clause.kernels() if k.clause not in normative or k.clause not in cited}
    assert not wrong, f"kernels naming a clause that is not normative or that no conformance test cites: {wrong}"


def test_selection_names_only_tests_citing_the_clause():
    expr = by_clause.selection("ATTN-LSE-3")
    assert "(test_lse.py and test_lse_matches_reference)" in expr and "test_agreement.py" not in expr


def _case(seed=0, B=2, Hq=4, Hkv=2, Lq=9, Lk=9, D=8, grad=False, **params) -> Case:
    rng = np.random.default_rng(seed)
    extra = {"grad_out": rng.normal(size=(B, Hq, Lq, D))} if grad else {}
    return Case.build(rng.normal(size=(B, Hq, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)),
                      rng.normal(size=(B, Hkv, Lk, D)), **extra, **params)


BIAS = np.random.default_rng(4).normal(size=(2, 4, 9, 9))
WITNESSES = {  # name -> (case, quantity the defect shows in)
    "output_dtype_float32_for_half": (_case(dtype="float16"), "out_dtype"),
    "uneven_groups_accepted": (None, "raw"),
    "mqa_broadcasts_head_zero": (_case(Hkv=1), "out"),
    "bias_dropped_under_causal": (_case(causal="top_left", bias=BIAS), "out"),
    "hidden_keys_leak_one_ulp": (_case(causal="top_left", dtype="float64"), "out"),
    "bottom_right_empty_rows_see_key0": (_case(Lq=9, Lk=4, causal="bottom_right"), "out"),
    "empty_row_uniform_weights": (_case(Lq=9, Lk=4, causal="bottom_right"), "weights"),
    "weights_unnormalised": (_case(), "weights"),
    "hidden_weights_tiny": (_case(causal="top_left", dtype="float64"), "weights"),
    "lse_of_the_mean": (_case(), "lse"),
    "lse_rows_by_heads": (_case(Lq=5), "lse"),
    "zero_dropout_keeps_255_of_256": (_case(Lq=64, Lk=64), "out"),
    "empty_row_dq_is_q": (_case(Lq=9, Lk=4, causal="bottom_right", grad=True), "dq"),
    "dbias_times_scale": (_case(bias=BIAS, grad=True), "dbias"),
    "sink_gradient_sign": (_case(sinks=np.array([0.5, 2.0, -1.0, 1.5]), grad=True), "dsinks"),
    "gradients_through_bfloat16": (_case(grad=True, dtype="float32"), "dq"),
    "float64_through_float32": (_case(dtype="float64"), "out"),
    "row_max_of_first_block": (_case(Lk=40, dtype="float64").replace(q=_case(Lk=40).q * 60), "out"),
    "decode_aligned_top_left": (_case(Lq=1, causal="bottom_right"), "out"),
    "keys_past_4096_dropped": (_case(B=1, Hq=1, Hkv=1, Lq=1, Lk=4100), "out"),
}


def _quantity(impl, case: Case, what: str):
    res = impl.run(case, grads=what in ("dq", "dbias", "dsinks"))
    ref = oracle(case)
    if what in ("out", "lse", "weights"):
        return getattr(res, what), getattr(ref, what)
    if what == "out_dtype":
        return res.out_dtype, case.dtype
    return res.grads[what], getattr(backward(case), what)


def test_clause_bugs_are_complete():
    assert set(WITNESSES) == set(clause_bugs.BUGS)
    for name, cls in clause_bugs.BUGS.items():
        assert cls.__doc__.startswith("Defect"), name


@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_clause_bug_differs_from_the_reference_on_its_witness(name):
    case, what = WITNESSES[name]
    impl = clause_bugs.BUGS[name]()
    if what == "raw":
        rng = np.random.default_rng(0)
        q, k, v = rng.normal(size=(1, 3, 4, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 5, 8))
        assert impl.run_raw(q, k, v, "float32").shape == (1, 3, 4, 8)   # returns where it must raise
        return
    got, want = _quantity(impl, case, what)
    if what == "out_dtype":
        assert got != want
        return
    if got.shape != want.shape:
        return
    with np.errstate(invalid="ignore"):
        err = np.where(np.isfinite(got) & np.isfinite(want), np.abs(got - want),
                       np.where(np.isneginf(got) & np.isneginf(want), 0.0, np.inf))
    assert err.max() > 0, f"{name}: no visible defect on its witness"
    # and the control is the reference on the same witness
    ctl, _ = _quantity(clause_bugs.VariantKernel(), case, what)
    eps = np.finfo(np.float64 if case.dtype == "float64" else np.float32).eps   # the control rounds once
    scale = float(np.abs(want[np.isfinite(want)]).max())             # gradients: another summation order
    np.testing.assert_allclose(ctl, want, rtol=0, atol=(4 * eps + 1e-9) * scale)


# ---- the proof (slow: one restricted suite run per normative clause) ------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("clause", [c for c in spec.normative() if c not in NO_KERNEL_FORM])
def test_suite_catches_a_kernel_on_its_clause(clause, tmp_path, record_property):
    if by_clause.witness(clause) is None:
        pytest.skip(f"{clause}: its catalogue kernels need torch")
    k, run = proof_run(clause, tmp_path / "run.json")
    f = run.first_failure or {}
    record_property("kernel", k.spec)
    record_property("seconds", round(run.wall_s, 1))
    assert run.returncode == 1, f"the tests citing {clause} did not catch {k.spec}:\n{run.output_tail}"
    assert clause in (f.get("clauses") or []), f"{k.spec} was caught by {run.caught_by}, which does not cite {clause}"
