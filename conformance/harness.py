"""What conformance tests call: run a case, judge a result, record what was seen.

Tests read as statements of the spec; everything they need from the plugin
goes through here. State for the test being run (counts, error ratios, the
last case) lives in one `TestRecord` that the plugin opens and closes around
each test, so a Hypothesis test can report "unsupported", "divergent" or the
exact failing case without any bookkeeping of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import seed as hseed
from hypothesis import settings as hsettings

from attnconf.adapters import Adapter, KernelError, Result
from attnconf.adapters.base import NotSupported
from attnconf.reference import Case

from . import tolerance

MAX_SAMPLES = 100


class ConformanceFailure(AssertionError):
    """A kernel broke a clause. The message starts with the clause id in brackets."""

    def __init__(self, clause: str, message: str, case: Case | None = None, impl: str = ""):
        self.clause = clause
        self.case = case
        text = message if message.startswith("[") else f"[{clause}] {message}"
        if impl:
            text = f"{impl}: {text}"
        if case is not None:
            text += f"\n  case: {case.summary()}"
        super().__init__(text)


class KernelAborted(BaseException):
    """The kernel crashed or hung. BaseException on purpose: Hypothesis must not retry or shrink it."""

    def __init__(self, status: str, detail: str, case: Case | None):
        self.status, self.detail, self.case = status, detail, case
        super().__init__(f"{status}: {detail}" + (f"\n  case: {case.summary()}" if case is not None else ""))


@dataclass
class TestRecord:
    nodeid: str
    test: str
    clauses: list[str]
    implementation: str
    examples: int = 0
    unsupported: int = 0
    unsupported_reasons: set[str] = field(default_factory=set)
    divergent: int = 0
    divergences: set[str] = field(default_factory=set)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    panel: list[dict[str, Any]] = field(default_factory=list)
    current_case: Case | None = None

    def add_judgement(self, j: tolerance.Judgement, case: Case) -> None:
        if not np.isfinite(j.ratio_max):
            return
        r = self.ratios.setdefault(j.dtype, {"max": 0.0, "mean": 0.0, "cases": 0})
        r["max"] = max(r["max"], j.ratio_max)
        r["mean"] = max(r["mean"], j.ratio_mean)
        r["cases"] += 1
        if len(self.samples) < MAX_SAMPLES and hasattr(case, "shape"):
            s = case.shape
            self.samples.append({"dtype": j.dtype, "quantity": j.quantity, "Lq": s["Lq"], "Lk": s["Lk"], "Dk": s["Dk"],
                                 "ratio_max": j.ratio_max, "ratio_mean": j.ratio_mean})


@dataclass
class Session:
    """Per-process settings the plugin fills in at configure time."""

    divergences: Any = None                    # conformance.divergences.Divergences
    device: str = "cpu"
    replay: Case | None = None
    long: bool = False
    measure_memory: bool = False
    seed: int | None = None                    # --hypothesis-seed: reseeds even the derandomized ci profile


SESSION = Session()
_CURRENT: TestRecord | None = None


def current() -> TestRecord:
    if _CURRENT is None:
        raise RuntimeError("conformance harness used outside a test run by the attnconf plugin")
    return _CURRENT


def begin(record: TestRecord) -> None:
    global _CURRENT
    _CURRENT = record


def end() -> TestRecord | None:
    global _CURRENT
    record, _CURRENT = _CURRENT, None
    return record


# ---- declaring tests ---------------------------------------------------

def clauses(*ids: str):
    """Mark a test with the spec clauses it checks (checked against spec/clauses.toml)."""
    return pytest.mark.clauses(*ids)


def for_cases(strategy, *, examples: Iterable[Case] = (), fixture: str = "impl", weight: float = 1.0):
    """Run the test for Hypothesis-generated cases, or for the one case given with --replay.

    The test takes (impl, case); any extra randomness it needs comes from
    `np.random.default_rng(case.seed)`, so the case alone determines the run
    and a saved case replays it exactly.
    """
    def decorate(fn: Callable[[Any, Case], None]):
        def one_example(target, case):
            rec = current()
            rec.examples += 1
            rec.current_case = case
            return fn(target, case)

        compiled: dict[int, Callable] = {}

        def hypothesis_test(n: int) -> Callable:
            if n not in compiled:
                h = given(case=strategy)(one_example)
                for ex in examples:
                    h = example(case=ex)(h)
                h = hsettings(hsettings.default, max_examples=n)(h)
                compiled[n] = hseed(SESSION.seed)(h) if SESSION.seed is not None else h
            return compiled[n]

        def test(**kwargs):
            target = kwargs[fixture]
            if SESSION.replay is not None:
                return one_example(target, SESSION.replay)
            n = max(1, round(hsettings.default.max_examples * weight * getattr(target, "example_budget", 1.0)))
            return hypothesis_test(n)(target)

        test.__signature__ = _signature(fixture)
        test.__name__, test.__qualname__ = fn.__name__, fn.__qualname__
        test.__doc__, test.__module__ = fn.__doc__, fn.__module__
        if hasattr(fn, "pytestmark"):
            test.pytestmark = fn.pytestmark
        return test
    return decorate


def _signature(name: str):
    import inspect

    return inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)])


# ---- running and judging ----------------------------------------------

def run(impl: Adapter, case: Case, *, grads: bool = False, need: Iterable[str] = (),
        divergence: bool = True) -> Result | None:
    """Run `impl` on `case`; None (recorded) if unsupported or inside a declared divergence.

    Checks the output contract (ATTN-OP-2 shape, ATTN-OP-5 dtype) on every call.
    """
    rec = current()
    entry = None
    if divergence and SESSION.divergences is not None:
        entry = SESSION.divergences.match(impl.name, case, gradients=grads)
    try:
        ok = impl.supports(case, need=frozenset(need) | ({"grads"} if grads else set()))
    except Exception as exc:  # the framework's own capability probe broke on this case
        if entry is None:
            raise ConformanceFailure("ATTN-OP-1", f"capability check raised {type(exc).__name__}: {exc}",
                                     case, impl.name) from None
        ok = True
    if ok is not True:
        rec.unsupported += 1
        rec.unsupported_reasons.add(str(ok))
        return None
    if entry is not None:
        rec.divergent += 1
        rec.divergences.add(entry["id"])
        return None
    try:
        res = impl.run(case, grads=grads)
    except NotSupported as exc:
        rec.unsupported += 1
        rec.unsupported_reasons.add(str(exc))
        return None
    except KernelError as exc:
        status = getattr(exc, "status", None)
        if status in ("crashed", "timeout"):
            raise KernelAborted(status, str(exc), case) from None
        raise ConformanceFailure("ATTN-OP-1", f"kernel error: {exc}", case, impl.name) from None
    except Exception as exc:  # the framework raised inside a trusted adapter: that implementation's failure
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConformanceFailure("ATTN-OP-1", f"raised {type(exc).__name__}: {first}", case, impl.name) from None
    if not isinstance(res, Result):
        raise ConformanceFailure("ATTN-OP-1", f"adapter returned {type(res).__name__}, not a Result", case, impl.name)
    if tuple(res.out.shape) != case.out_shape:
        raise ConformanceFailure("ATTN-OP-2", f"output shape {tuple(res.out.shape)} != expected {case.out_shape}",
                                 case, impl.name)
    if res.out_dtype != case.dtype:
        raise ConformanceFailure("ATTN-OP-5", f"output dtype {res.out_dtype} != input dtype {case.dtype}",
                                 case, impl.name)
    return res


def judge(j: tolerance.Judgement, case: Case, impl: Adapter | str, clause: str | None = None) -> tolerance.Judgement:
    """Record a judgement's error ratios and fail if it does not hold."""
    current().add_judgement(j, case)
    if not j.ok:
        name = impl if isinstance(impl, str) else impl.name
        raise ConformanceFailure(clause or _clause_of(j.reason), j.explain(), case, name)
    return j


def _clause_of(reason: str) -> str:
    return reason[1:reason.index("]")] if reason.startswith("[") else "ATTN-TOL-1"


def expect_close(actual: np.ndarray, case: Case, impl: Adapter | str, *, clause: str | None = None) -> tolerance.Judgement:
    """The forward output agrees with the reference under the tolerance model (ATTN-TOL-1..4)."""
    j = tolerance.judge_output(actual, case)
    if clause and not j.ok and not j.reason.startswith("[ATTN-TOL-3]"):
        j.reason = f"[{clause}] " + j.reason.split("] ", 1)[-1]
    return judge(j, case, impl, None)


def expect_agree(o1: np.ndarray, j1: tolerance.Judgement, o2: np.ndarray, j2: tolerance.Judgement, *, gap: float,
                 clause: str, what: str, case: Case, impl: Adapter | str) -> None:
    """Two kernel outputs agree within both allowances plus `gap`, the distance between their references."""
    finite = np.isfinite(o1) & np.isfinite(o2)
    d = float(np.abs(o1 - o2)[finite].max(initial=0.0))
    allowed = j1.allowed_max + j2.allowed_max + gap
    expect(d <= allowed, clause, f"{what}: outputs differ by {d:.3g} > combined allowance {allowed:.3g}", case, impl)


def expect_equivalent(impl: Adapter, case1: Case, case2: Case, *, clause: str, what: str,
                      clause1: str | None = None) -> None:
    """Two cases the spec says are equivalent: each output within tolerance of its own reference,
    and the two outputs within both allowances plus the distance between the references."""
    r1, r2 = run(impl, case1), run(impl, case2)
    if r1 is None or r2 is None:
        return
    j1 = expect_close(r1.out, case1, impl, clause=clause1 or clause)
    j2 = expect_close(r2.out, case2, impl, clause=clause)
    expect_agree(r1.out, j1, r2.out, j2, gap=reference_gap(case1, case2), clause=clause, what=what,
                 case=case2, impl=impl)


def reference_gap(case1: Case, case2: Case) -> float:
    """max |O_ref(case1) - O_ref(case2)|: how far two cases' exact answers are apart."""
    from attnconf.reference import oracle

    return float(np.nanmax(np.abs(oracle(case1).out - oracle(case2).out), initial=0.0))


def expect(condition: bool, clause: str, message: str, case: Case | None, impl: Adapter | str) -> None:
    if not condition:
        raise ConformanceFailure(clause, message, case, impl if isinstance(impl, str) else impl.name)


def observe(clause: str, key: str, value: Any, case: Case | None = None) -> None:
    """Record a behaviour for the report (ATTN-NAN-*, ATTN-OP-7): a report row, not a verdict."""
    current().observations.append({"clause": clause, "implementation": current().implementation, "key": key,
                                   "value": value, "case": case.summary() if case is not None else None})


def record_panel(entry: dict[str, Any]) -> None:
    current().panel.append(entry)
