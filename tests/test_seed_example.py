"""The seed document's worked example (ATTN-SEED-1) and its erratum.

The figures in spec/seed_example.toml are the spec's answer for the example;
the reference must reproduce them to the printed 3 decimals, and the figures
the source document printed must NOT be reproduced, otherwise the erratum in
SPEC.md would be false. The clause statement in spec/clauses.toml quotes row 0,
so it is checked against the same file to keep the two from drifting.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from attnconf.reference.attention import forward

SPEC = Path(__file__).resolve().parents[1] / "spec"
HALF_ULP_3 = 5e-4   # half a unit in the 3rd decimal: "rounds to the printed figure"
HALF_ULP_2 = 5e-3   # half a unit in the 2nd decimal, the precision the source printed


def _example() -> dict:
    with open(SPEC / "seed_example.toml", "rb") as f:
        return tomllib.load(f)["example"]


def _reference(ex: dict) -> dict[str, np.ndarray]:
    q, k, v = (np.asarray(ex[n], dtype=np.float64)[None, None] for n in ("q", "k", "v"))
    f = forward(q, k, v)
    return {"scores": f.logits[0, 0], "weights": f.weights[0, 0], "output": f.out[0, 0]}


@pytest.mark.clauses("ATTN-SEED-1")
@pytest.mark.parametrize("quantity", ["scores", "weights", "output"])
def test_reference_reproduces_the_example(quantity: str) -> None:
    ex = _example()
    got = _reference(ex)[quantity]
    want = np.asarray(ex["expected"][quantity])
    assert got.shape == want.shape
    # 1e-12 absorbs the float64 error of the reference itself at an exact half.
    assert np.max(np.abs(got - want)) <= HALF_ULP_3 + 1e-12, f"{quantity}:\n{got}\n!=\n{want}"


@pytest.mark.clauses("ATTN-SEED-1")
@pytest.mark.parametrize("quantity", ["scores", "weights", "output"])
def test_printed_figures_are_an_erratum(quantity: str) -> None:
    ex = _example()
    got = _reference(ex)[quantity][0]
    printed = np.asarray(ex["erratum"][f"{quantity}_row0"])
    assert np.max(np.abs(got - printed)) > HALF_ULP_2, (
        f"the printed {quantity} {printed.tolist()} match the reference {got.round(3).tolist()}"
    )


@pytest.mark.clauses("ATTN-SEED-1")
def test_clause_statement_quotes_the_example() -> None:
    with open(SPEC / "clauses.toml", "rb") as f:
        clause = next(c for c in tomllib.load(f)["clause"] if c["id"] == "ATTN-SEED-1")
    quoted = [[float(x) for x in grp.split(",")] for grp in re.findall(r"\[([^\]]+)\]", clause["statement"])]
    expected = _example()["expected"]
    assert quoted == [expected["scores"][0], expected["weights"][0], expected["output"][0]]


@pytest.mark.clauses("ATTN-SEED-1")
def test_weights_are_a_distribution() -> None:
    w = _reference(_example())["weights"]
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
