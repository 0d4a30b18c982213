"""One finding per cause (conformance/engine/causes.py): each diagnosis names the behaviour it was written for, on
synthetic outputs computed by the reference under that behaviour, and the grouping of records."""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.conformance.engine import causes
from attnconf.reference import Case, naive_forward, oracle
from attnconf.reports.causes import cause_line


def _qkv(b=1, h=2, lq=5, lk=7, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((b, h, lq, d)), rng.standard_normal((b, h, lk, d)), rng.standard_normal((b, h, lk, d))


def _masked(dtype="float32") -> Case:
    q, k, v = _qkv()
    mask = np.ones((1, 1, 5, 7), dtype=bool)
    mask[..., 2, :] = False                       # row 2 sees no key
    mask[..., 4, 3:] = False
    return Case.build(q, k, v, mask=mask, dtype=dtype)


def _empty_rows(case: Case, value) -> np.ndarray:
    out = oracle(case).out.copy()
    rows = ~oracle(case).visible.any(axis=-1)
    if value == "mean":
        hidden = ~oracle(case).visible
        w = np.where(hidden & rows[..., None], 1.0, 0.0)
        out[rows] = ((w @ case.v) / np.maximum(w.sum(-1, keepdims=True), 1))[rows]
    else:
        out[rows] = value
    return out


@pytest.mark.parametrize("value, name", [(np.nan, "empty_rows_nan"), (0.0, "empty_rows_zero"),
                                         ("mean", "empty_rows_mean_of_values")])
def test_empty_rows(value, name):
    case = _masked()
    out = _empty_rows(case, value)
    if value == 0.0:          # the spec's own answer for an empty row is 0: break it to make the row a failure
        case = _masked("float64")
        out = _empty_rows(case, np.nan)
        assert causes.diagnose(case, out, "ATTN-EMPTY-1") == "empty_rows_nan"
        return
    assert causes.diagnose(case, out, "ATTN-EMPTY-1") == name
    assert causes.BY_NAME[name].declaration.startswith("empty_rows = ")


def test_empty_rows_wrong_elsewhere_is_not_explained():
    case = _masked()
    out = _empty_rows(case, np.nan)
    out[0, 0, 0] += 1.0                          # a row that sees keys is wrong too
    assert causes.diagnose(case, out, "ATTN-EMPTY-1").startswith("unexplained:")


def test_scale_ignored_and_rounded():
    q, k, v = _qkv()
    case = Case.build(q, k, v, scale=0.3, dtype="float32")
    assert causes.diagnose(case, oracle(case.replace(scale=None)).out, "ATTN-SCALE-1") == "scale_ignored"
    # rounding the scale to a half type stays within that type's own tolerance on drawn cases; the hypothesis
    # is the problem with the rounded scale, and no hypothesis at all where there is nothing to round
    half = Case.build(q, k, v, scale=0.3, dtype="float16")
    assert causes._scale_rounded(half).scale == 0.300048828125
    assert causes._scale_rounded(case.replace(dtype="float64")) is None
    assert causes.BY_NAME["scale_rounded"].declaration == 'scale_rounding = "input_dtype"'


def test_causal_top_left_instead_of_bottom_right():
    q, k, v = _qkv(lq=4, lk=9)
    case = Case.build(q, k, v, causal="bottom_right", dtype="float32")
    out = oracle(case.replace(causal="top_left")).out
    assert causes.diagnose(case, out, "ATTN-CAUSAL-2") == "causal_top_left"


def test_padding_keys_attended():
    q, k, v = _qkv(lq=6, lk=50)
    case = Case.build(q, k, v, dtype="float32")
    pad = [(0, 0), (0, 0), (0, 14), (0, 0)]
    out = oracle(case.replace(k=np.pad(case.k, pad), v=np.pad(case.v, pad))).out
    assert causes.diagnose(case, out, "ATTN-TOL-1") == "padding_keys_attended"


def test_lower_precision():
    q, k, v = _qkv(lk=64, d=64, seed=3)
    case = Case.build(q * 4, k * 4, v, dtype="float32")
    out, _ = naive_forward(case.replace(dtype="bfloat16"))
    got = causes.diagnose(case, np.asarray(out, np.float64), "ATTN-TOL-1")
    assert got in ("computed_in_bfloat16", "computed_in_float16"), got
    assert causes.BY_NAME[got].declaration.startswith("compute_dtype = ")


def test_mutation_and_no_output():
    case = _masked()
    assert causes.diagnose(case, None, "ATTN-OP-8") == "argument_mutated"
    assert causes.diagnose(case, None, "ATTN-OP-1") == "unexplained:ATTN-OP-1"
    assert causes.diagnose(case, oracle(case).out, "ATTN-LSE-1") == "unexplained:ATTN-LSE-1"   # output conforms


def test_a_failure_judged_on_derived_cases_takes_the_cause_of_their_outputs():
    case = _masked()
    derived = case.replace(v=np.ones_like(case.v))
    got = causes.diagnose(case, None, "ATTN-W-1", others=[(derived, _empty_rows(derived, np.nan))])
    assert got == "empty_rows_nan"
    assert causes.diagnose(case, None, "ATTN-W-1", others=[(derived, oracle(derived).out)]) == "unexplained:ATTN-W-1"


def _rec(test, clause, cause, dtype="float32", file=None):
    return {"status": "fail", "test": test, "failed_clause": clause, "cause": cause, "implementation": "k",
            "dtype": dtype, "case": "B=1", "failure_file": file, "replay": f"replay {file}" if file else None}


def test_group_one_line_per_cause():
    records = [_rec("test_a", "ATTN-EMPTY-1", "empty_rows_nan", file="a.npz"),
               _rec("test_b", "ATTN-TOL-3", "empty_rows_nan", "float16", file="b.npz"),
               _rec("test_c", "ATTN-LSE-1", "empty_rows_nan"),
               _rec("test_d", "ATTN-OP-1", "unexplained:ATTN-OP-1", file="d.npz"),
               {"status": "pass", "test": "test_e"}]
    got = causes.group(records)
    assert [g["id"] for g in got] == ["empty_rows_nan", "unexplained:ATTN-OP-1"]
    nan = got[0]
    assert nan["clauses"] == ["ATTN-EMPTY-1", "ATTN-LSE-1", "ATTN-TOL-3"] and nan["failures"] == 3
    assert nan["failure_file"] == "a.npz" and nan["declaration"] == 'empty_rows = "nan"'
    assert nan["dtypes"] == ["float16", "float32"]
    line = cause_line(nan)
    assert 'declare empty_rows = "nan"' in line and "3 failure(s)" in line
    assert "declare" not in cause_line(got[1])


def test_keeper_saves_one_case_per_cause_and_per_clause():
    k = causes.Keeper()
    assert k.existing("nan", "ATTN-EMPTY-1") is None
    k.keep("nan", "ATTN-EMPTY-1", "a.npz", "ra")
    assert k.existing("nan", "ATTN-EMPTY-1") == ("a.npz", "ra")      # same cause, same clause: reuse
    assert k.existing("nan", "ATTN-TOL-3") is None                    # a new clause gets its own case
    k.keep("nan", "ATTN-TOL-3", "b.npz", "rb")
    assert k.existing("zero", "ATTN-TOL-3") is None                   # a new cause too
    k.keep("zero", "ATTN-TOL-3", "c.npz", "rc")
    assert k.existing("zero", "ATTN-EMPTY-1") == ("a.npz", "ra")      # both seen: the clause's case


def test_certificate_lists_causes_and_writes_a_badge(tmp_path):
    from attnconf.reports import badge, certificate

    run = {"run_id": "r", "created": "2026-11-28T00:00:00Z", "environment": {"backend": "torch", "device": "cpu",
           "kernel": "k:f", "scopes": {"k": {"dtypes": ["float32", "float16"]}}},
           "records": [], "cells": [], "verdict": {"verdict": "NONCONFORMANT", "failed_clauses": [], "failures": []},
           "causes": causes.group([_rec("test_a", "ATTN-EMPTY-1", "empty_rows_nan", file="a.npz")])}
    md, _ = certificate.write_files(run, tmp_path / "certificate.md", tmp_path / "certificate.json")
    text = md.read_text()
    assert "### Causes" in text and 'declare `empty_rows = "nan"`' in text and "replay a.npz" in text
    svg = (tmp_path / "certificate.svg").read_text()
    assert svg.startswith("<svg") and badge.COLOURS["NONCONFORMANT"] in svg and "float32, float16" in svg
    for verdict, colour in (("CONFORMANT", "#2e7d32"), ("CONFORMANT_WITH_DIVERGENCES", "#e69500"),
                            ("INCOMPLETE", "#e69500")):
        assert colour in badge.render({"verdict": verdict, "scopes": {}})


def test_plugin_diagnoses_from_the_kept_output_and_reuses_saved_cases():
    from types import SimpleNamespace

    from attnconf.conformance.engine import harness, plugin

    case = _masked()
    rec = harness.TestRecord("n", "t", [], "k")
    rec.outputs.append((case, _empty_rows(case, np.nan)))
    state = SimpleNamespace(keeper=None)
    assert plugin._cause(state, rec, case, "ATTN-EMPTY-1") == ("empty_rows_nan", None)
    state.keeper.keep("empty_rows_nan", "ATTN-EMPTY-1", "a.npz", "replay a")
    assert plugin._cause(state, rec, case, "ATTN-EMPTY-1") == ("empty_rows_nan", ("a.npz", "replay a"))
