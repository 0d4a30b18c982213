"""Cells of a compile-per-shape implementation share their clauses' coverage floor, without ever leaving
a clause short that a later cell could fill (harness.cell_minimum), and a kernel that requires a feature
of every case stops drawing for a property whose cases never have it (harness OFFER_DRAWS).

The cells here run the harness's own `for_cases` wrapper on a stand-in adapter, in this process: the
properties only count their examples, so nothing but the sharing is under test.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as hst

from attnconf.adapters.base import CAPABILITIES, Adapter
from attnconf.conformance.engine import harness
from attnconf.conformance import strategies as st
from attnconf.reference import Case


class CompilesEveryShape(Adapter):
    name = "stand-in:compiled"
    backend = "numpy"
    example_budget = 0.35
    capabilities = frozenset({"mask", "sinks"})

    def run(self, case, *, grads=False):      # never called: the properties below only count
        raise AssertionError("not called")


class ReadsSinksAlways(CompilesEveryShape):
    name = "stand-in:sinks"
    example_budget = 1.0
    requires = frozenset({"sinks"})


def _case(seed: int, sinks: bool = False) -> Case:
    return st.fixed_case(seed, dtype="float32", sinks=np.zeros(2) if sinks else None)


plain = hst.integers(0, 10**6).map(_case)


def _cell(strategy, clause_ids: tuple[str, ...], judged: bool = True):
    """A for_cases test citing `clause_ids` whose property judges every case (or none)."""
    def prop(impl, case):
        if judged:
            impl.record.note_ran()
        elif impl.supports(case) is not True:
            impl.record.note_unsupported(str(impl.supports(case)))
    return harness.clauses(*clause_ids)(harness.for_cases(strategy, dtypes=("float32",))(prop))


@pytest.fixture(autouse=True)
def ci_profile():
    """The ci profile's example count (for_cases reads the default settings), derandomized."""
    previous = settings.get_current_profile_name()
    settings.register_profile("attnconf-floor-sharing", max_examples=25, derandomize=True, database=None,
                              deadline=None, suppress_health_check=list(HealthCheck))
    settings.load_profile("attnconf-floor-sharing")
    yield
    settings.load_profile(previous)


def _run(test, adapter: Adapter, session: harness.Session) -> harness.TestRecord:
    rec = harness.TestRecord("t", "t", [], adapter.name, dtype="float32")
    try:
        test(impl=harness.Subject(adapter, rec, session), dtype="float32")
    except pytest.skip.Exception as exc:
        rec.unsupported_reasons.add(str(exc))
    return rec


def _session() -> harness.Session:
    return harness.Session(backend="numpy", impls=[], divergences=None)


def test_the_first_cell_of_a_clause_draws_the_floor_and_later_ones_their_budget():
    session, adapter = _session(), CompilesEveryShape()
    first = _run(_cell(plain, ("ATTN-OP-1",)), adapter, session)
    assert first.checked == harness.MIN_CELL_EXAMPLES
    later = _run(_cell(plain, ("ATTN-OP-1",)), adapter, session)
    assert later.checked == round(25 * adapter.example_budget / 4)        # the budget (2), not the floor
    fresh = _run(_cell(plain, ("ATTN-OP-1", "ATTN-MASK-1")), adapter, session)
    assert fresh.checked == harness.MIN_CELL_EXAMPLES                    # MASK-1 had nothing yet
    assert session.floor_checked[(adapter.name, "ATTN-MASK-1", "float32")] == harness.MIN_CELL_EXAMPLES


def test_a_cell_that_judges_nothing_leaves_the_whole_floor_to_the_next():
    session, adapter = _session(), CompilesEveryShape()
    with_reason = _run(_cell(plain, ("ATTN-OP-1",), judged=False), adapter, session)
    assert with_reason.checked == 0
    after = _run(_cell(plain, ("ATTN-OP-1",)), adapter, session)
    assert after.checked == harness.MIN_CELL_EXAMPLES


def test_an_implementation_that_does_not_compile_per_shape_draws_the_floor_in_every_cell():
    session, adapter = _session(), CompilesEveryShape()
    adapter.example_budget = 1.0
    for _ in range(2):
        rec = _run(_cell(plain, ("ATTN-OP-1",)), adapter, session)
        assert rec.checked == round(25 / 4)
    assert not session.floor_checked


def test_cases_without_a_required_feature_end_the_cell_after_a_few_draws():
    session, adapter = _session(), ReadsSinksAlways()
    rec = _run(_cell(plain, ("ATTN-OP-1",), judged=False), adapter, session)
    assert rec.examples == harness.OFFER_DRAWS
    assert any("runs only cases with sinks" in r and "never have" in r for r in rec.unsupported_reasons), \
        rec.unsupported_reasons


def test_a_strategy_that_offers_the_required_feature_is_not_cut_short():
    @hst.composite
    def sometimes_sinks(draw):
        seed = draw(hst.integers(0, 10**6))
        st.offer("sinks")
        return _case(seed, sinks=draw(hst.integers(0, 9)) == 0)

    session, adapter = _session(), ReadsSinksAlways()

    def prop(impl, case):
        if case.sinks is not None:
            impl.record.note_ran()
    test = harness.clauses("ATTN-OP-1")(harness.for_cases(sometimes_sinks(), dtypes=("float32",))(prop))
    rec = _run(test, adapter, session)
    assert rec.checked == round(25 / 4) and rec.examples > harness.OFFER_DRAWS


def test_a_case_refused_for_another_reason_too_is_shown_with_that_reason():
    """Fitting adds what a kernel requires, not what else is wrong: the requirement is the last refusal."""
    class ReadsSinksNoFloat16(ReadsSinksAlways):
        capabilities = CAPABILITIES

        def extra_support(self, case):
            return "stand-in: no float16" if case.dtype == "float16" else True

    adapter = ReadsSinksNoFloat16()
    assert adapter.supports(st.fixed_case(1, dtype="float16")) == "stand-in: no float16"
    assert "runs only cases with sinks" in adapter.supports(st.fixed_case(1, dtype="float32"))
    assert adapter.supports(st.fixed_case(1, dtype="float32", sinks=np.zeros(2))) is True
