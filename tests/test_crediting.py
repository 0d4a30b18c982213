"""An honest certificate (issue 24 item 4): a clause x dtype cell is credited only by examples that exercise
the clause's subject (spec/clauses.toml `subject`), and a subject outside the declared scope makes the cell
out of scope; out of scope, in scope but not run, and checked stay three states."""
from __future__ import annotations

from attnconf.conformance.engine import verdict


def _rec(test, clauses, checked, features=None, dtype="float32", status="pass"):
    return {"implementation": "k", "test": test, "nodeid": test, "clauses": clauses, "dtype": dtype,
            "status": status, "examples_checked": checked, "checked_features": features or {}}


def _cells(records, features):
    impls = {"k": {"kind": "sdpa", "dtypes": ["float32"], "features": features}}
    return {c: x.status(3) for (i, c, d), x in verdict.build_cells(records, impls, [], {}).items()}


def test_subjects_are_declared_once_in_the_spec():
    s = verdict.subjects()
    assert s["ATTN-MASK-1"] == ("mask",) and s["ATTN-GQA-1"] == ("gqa",) and s["ATTN-GRAD-2"] == ("dbias",)
    assert "ATTN-TOL-1" not in s


def test_examples_without_the_subject_do_not_credit_it():
    rec = _rec("test_mask", ["ATTN-MASK-1", "ATTN-TOL-1"], 5, {"": 3, "mask": 1, "causal_top_left+mask": 1})
    assert verdict.credited(rec, ("mask",)) == 2
    assert verdict.credited(rec, None) == 5
    assert verdict.credited({**rec, "checked_features": {}}, ("mask",)) == 5    # an older run file: as before
    cells = _cells([rec], ["mask"])
    assert cells["ATTN-TOL-1"] == "conformant" and cells["ATTN-MASK-1"] == "below_floor"


def test_three_states():
    recs = [_rec("t_gqa", ["ATTN-GQA-1"], 4, {"": 4}), _rec("t_mask", ["ATTN-MASK-1"], 4, {"": 4}),
            _rec("t_bias", ["ATTN-MASK-2"], 4, {"bias": 4})]
    cells = _cells(recs, ["mask", "bias"])
    assert cells["ATTN-GQA-1"] == "unsupported"        # gqa not declared: out of scope, not credited
    assert cells["ATTN-MASK-1"] == "not_run"           # in scope, no example had a mask
    assert cells["ATTN-MASK-2"] == "conformant"        # checked


def test_a_failure_out_of_scope_still_fails():
    rec = {**_rec("t", ["ATTN-MASK-1"], 1, {"": 1}, status="fail"), "failed_clause": "ATTN-MASK-1", "message": "x"}
    assert _cells([rec], [])["ATTN-MASK-1"] == "failing"


def test_a_cell_that_rarely_exercised_a_subject_draws_more():
    from types import SimpleNamespace

    from attnconf.conformance.engine import harness

    rec = harness.TestRecord("n", "t", [], "k")
    rec.checked, rec.checked_features = 5, {"": 3, "causal_top_left": 2}
    declares = SimpleNamespace(capabilities={"causal_top_left"})
    assert harness.subject_shortfall(declares, rec, ["ATTN-PROP-3", "ATTN-W-1"])
    assert not harness.subject_shortfall(SimpleNamespace(capabilities=set()), rec, ["ATTN-PROP-3"])  # out of scope
    rec.checked_features = {"": 5}
    assert not harness.subject_shortfall(declares, rec, ["ATTN-PROP-3"])   # the strategy is not about it
    rec.checked_features = {"causal_top_left": 3, "": 2}
    assert not harness.subject_shortfall(declares, rec, ["ATTN-PROP-3"])   # enough


def test_the_top_up_is_decided_by_the_cell_alone():
    """The cells that ran before do not count: a run split over xdist workers draws what one process draws."""
    import inspect

    from attnconf.conformance.engine import harness

    assert list(inspect.signature(harness.subject_shortfall).parameters) == ["adapter", "rec", "cited"]
