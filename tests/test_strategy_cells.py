"""The cell strategies draw for (conformance/strategies/cells.py): one value, made current by `cell()` alone and
restored when the block ends, so that a case drawn after a cell is never bent by that cell's scope."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from attnconf.conformance import strategies as st
from attnconf.conformance.strategies import cells


def _scope(*features: str) -> dict:
    return {"features": frozenset(features), "max_seqlen": 17}


def test_outside_a_cell_everything_is_allowed_and_nothing_recorded():
    assert cells.current() is cells.OUTSIDE
    assert cells.allows("sinks", "gqa") and cells.limit("max_seqlen") is None
    st.offer("sinks")
    assert st.offered() == frozenset()


def test_a_cell_holds_its_dtype_scope_and_offers_until_it_ends():
    with st.cell("float16", _scope("gqa")) as outer:
        assert cells.current() is outer and outer.dtype == "float16"
        assert cells.allows("gqa") and not cells.allows("gqa", "sinks") and cells.limit("max_seqlen") == 17
        st.offer("sinks")
        with st.cell(None, None):
            assert cells.allows("sinks") and st.offered() == frozenset()
        assert cells.current() is outer and st.offered() == {"sinks"}
    assert cells.current() is cells.OUTSIDE and st.offered() == frozenset()


def test_strategies_draw_the_cells_dtype_and_stay_inside_its_limits():
    seen = []

    @settings(max_examples=20, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.cases(max_len=65))
    def draw(case):
        seen.append(case)

    with st.cell("bfloat16", _scope()):
        draw()
    assert seen and all(c.dtype == "bfloat16" and max(c.shape["Lq"], c.shape["Lk"]) <= 17 for c in seen)
    assert all(c.mask is None and c.causal is None and c.sinks is None for c in seen)
