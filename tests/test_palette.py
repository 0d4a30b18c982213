"""The shape palette (conformance/strategies/palette.py): it keeps every boundary shape and the odd and block-boundary
sizes, and on a compile-per-shape implementation the strategies draw only its shapes."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from attnconf.adapters.base import CAPABILITIES, COMPILES_PER_SHAPE
from attnconf.conformance.strategies import boundaries, palette
from attnconf.conformance.engine import harness
from attnconf.conformance import strategies as S

ODD = (1, 3, 5, 7, 13, 17, 31, 33)
BLOCK_EDGES = (63, 64, 65, 127, 128, 129, 255, 257, 385)


class _Impl:
    capabilities = CAPABILITIES - {"kv_covers_q"}
    example_budget = COMPILES_PER_SHAPE


def _scope(budget: float = COMPILES_PER_SHAPE):
    impl = _Impl()
    impl.example_budget = budget
    return harness.scope_of(impl)


def test_every_boundary_shape_and_its_drawn_variants_are_in_the_palette():
    for b in boundaries.BOUNDARIES:
        assert palette.contains(b.shape), b.id
        assert all(palette.contains(v) for v in palette.boundary_variants(b)), b.id


def test_palette_keeps_odd_and_block_boundary_sizes():
    assert set(ODD + BLOCK_EDGES + S.LONG_HISTORIES + S.SHORT_QUERIES) <= set(palette.LENGTHS)
    dims = {s[d] for s in palette.PALETTE for d in ("Dk", "Dv")}
    assert {1, 2, 3, 5} | set(boundaries.TEMPLATES) <= dims
    assert any(s["Dk"] != s["Dv"] for s in palette.BASE)
    assert {s["Hq"] // s["Hkv"] for s in palette.BASE} >= set(S.GROUPS) | {3}
    # self-attention keeps every odd and block-boundary length (implementations without cross attention)
    assert set(ODD + BLOCK_EDGES) <= {s["Lq"] for s in palette.BASE if s["Lq"] == s["Lk"]}
    assert all(s["B"] * s["Hq"] * s["Lq"] * s["Lk"] * (s["Dk"] + s["Dv"]) <= S.BUDGET for s in palette.BASE)


def test_compile_per_shape_declaration_turns_the_palette_on(monkeypatch):
    monkeypatch.delenv(palette.ENV, raising=False)
    monkeypatch.setattr(palette, "WIDE_FROM", 10**9)          # as under the dev and ci profiles
    assert _scope()["palette"] and not _scope(1.0)["palette"]
    monkeypatch.setattr(palette, "WIDE_FROM", 1)              # a wide search (thorough): no palette
    assert not _scope()["palette"]
    monkeypatch.setattr(palette, "WIDE_FROM", 10**9)
    monkeypatch.setenv(palette.ENV, "1")
    assert _scope(1.0)["palette"]
    monkeypatch.setenv(palette.ENV, "0")
    assert not _scope()["palette"]


FAMILIES = {
    "cases": S.cases(),
    "cases_grad": S.cases(grad=True, max_len=33),
    "mask": S.mask_cases(),
    "gqa": S.gqa_cases(),
    "mqa": S.gqa_cases(mqa=True),
    "tall": S.causal_cases(tall=True),
    "empty_rows": S.empty_row_cases(),
    "per_batch": S.per_batch_mask_cases(),
    "window": S.window_cases(),
    "alibi": S.alibi_cases(),
    "sinks": S.sink_cases(),
    "convention": S.convention_cases(),
    "lse": S.lse_cases(),
    "decode": S.decode_cases(),
}


def _drawn_shapes(strategy, budget: float = COMPILES_PER_SHAPE) -> list[dict]:
    """The shapes 40 derandomized draws of `strategy` give inside a cell of an implementation whose
    example_budget is `budget` (default: a compile-per-shape one)."""
    seen = []

    @settings(max_examples=40, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(hst.data())
    def draw(data):
        with S.cell(None, _scope(budget)):
            seen.append(data.draw(strategy).shape)

    draw()
    return seen


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_strategies_draw_only_palette_shapes_on_a_compile_per_shape_implementation(monkeypatch, family):
    monkeypatch.delenv(palette.ENV, raising=False)
    seen = _drawn_shapes(FAMILIES[family])
    assert seen and all(palette.contains(s) for s in seen), [s for s in seen if not palette.contains(s)][:3]


def test_free_draws_leave_the_palette_on_other_implementations(monkeypatch):
    """The check above can fail: the same strategy, eager, draws shapes outside the palette."""
    monkeypatch.delenv(palette.ENV, raising=False)
    assert not all(palette.contains(s) for s in _drawn_shapes(S.cases(), 1.0))
