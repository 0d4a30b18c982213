"""Unsupported is a value the engine handles: `harness.run` records why a case does not run and raises
`Unsupported` (or `RaisedAsDeclared`), so a property never guards a missing result, and the example
loop counts the example unsupported and draws another.

The cells run the harness's own `for_cases` wrapper on a stand-in adapter, in this process.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as hst

from attnconf.adapters import Result
from attnconf.adapters.base import Adapter, NotSupported
from attnconf.conformance import strategies as st
from attnconf.conformance.engine import harness
from attnconf.reference import oracle


class OddSeedsOutOfScope(Adapter):
    """Runs the reference on even seeds; odd seeds are outside its scope, seeds ending in 2 it refuses."""

    name = "stand-in:even"
    backend = "numpy"
    capabilities = frozenset()

    def supports(self, case, *, need=frozenset()):
        return True if case.seed % 2 == 0 else "odd seeds are outside the declared scope"

    def run(self, case, *, grads=False):
        if case.seed % 10 == 2:
            raise NotSupported("the kernel refuses seeds ending in 2")
        return Result(out=oracle(case).out.copy(), out_dtype=case.dtype)


@pytest.fixture(autouse=True)
def ci_profile():
    previous = settings.get_current_profile_name()
    settings.register_profile("attnconf-unsupported", max_examples=25, derandomize=True, database=None,
                              deadline=None, suppress_health_check=list(HealthCheck))
    settings.load_profile("attnconf-unsupported")
    yield
    settings.load_profile(previous)


def _subject() -> harness.Subject:
    session = harness.Session(backend="numpy", impls=[], divergences=None)
    adapter = OddSeedsOutOfScope()
    return harness.Subject(adapter, harness.TestRecord("t", "t", [], adapter.name, dtype="float32"), session)


def test_run_raises_unsupported_and_records_why():
    impl = _subject()
    with pytest.raises(harness.Unsupported, match="outside the declared scope"):
        harness.run(impl, st.fixed_case(1, dtype="float32"))
    with pytest.raises(harness.Unsupported, match="refuses"):
        harness.run(impl, st.fixed_case(12, dtype="float32"))
    res = harness.run(impl, st.fixed_case(4, dtype="float32"))
    assert isinstance(res, Result) and impl.record.checked == 1 and impl.record.unsupported == 2
    assert len(impl.record.unsupported_reasons) == 2


def test_a_property_never_sees_a_missing_result():
    seen = []

    def prop(impl, case):
        res = harness.run(impl, case)        # no guard: an unsupported case never gets past this line
        seen.append(res)
        harness.expect_close(res.out, case, impl)

    strategy = hst.integers(0, 10**6).map(lambda seed: st.fixed_case(seed, dtype="float32"))
    test = harness.clauses("ATTN-OP-1")(harness.for_cases(strategy, dtypes=("float32",))(prop))
    impl = _subject()
    test(impl=impl, dtype="float32")
    rec = impl.record
    assert seen and all(isinstance(r, Result) for r in seen)
    assert rec.checked == len(seen) and rec.unsupported > 0
    assert rec.examples == rec.checked + rec.unsupported        # every example is one or the other
    assert any("outside the declared scope" in r for r in rec.unsupported_reasons)


def test_unsupported_is_not_an_exception_a_test_would_take_for_a_kernel_error():
    """A test's own `except Exception` around a call (a kernel raising on NaN input is recorded) must not
    swallow the engine's outcome."""
    assert not issubclass(harness.NoResult, Exception)
    assert issubclass(harness.Unsupported, harness.NoResult) and issubclass(harness.RaisedAsDeclared, harness.NoResult)
