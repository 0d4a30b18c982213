"""What conformance tests call: run a case, judge a result, record what was seen.

Tests read as statements of the spec. The implementation a test receives is a
`Subject`: the adapter under test bound to the test's own `TestRecord` and to the
run's `Session` (both owned by the plugin, which keeps the session on
`config.stash`), so nothing here lives in module globals and a Hypothesis test can
report "unsupported", "divergent as declared" or the exact failing case without
bookkeeping of its own.

`run()` is where declared divergences act: the elements an applied entry covers
are judged against what the entry says the implementation does instead
(conformance/engine/alternatives.py), and then replaced by the spec's own values, so
every later check of the test judges the rest of the case as usual and none of
them can be fooled or tripped by the covered elements.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import signal
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import pytest
from hypothesis import example, given, reject
from hypothesis.errors import Unsatisfiable
from hypothesis import seed as hseed
from hypothesis import settings as hsettings

from attnconf.adapters import Adapter, KernelError, Result
from attnconf.adapters.base import NotSupported
from attnconf.reference import DTYPES, Case

from attnconf.conformance.strategies import boundaries, palette
from attnconf.conformance.engine import alternatives, tolerance
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance import strategies as strategies_module

MAX_SAMPLES = 100
KEEP_OUTPUTS = 32              # kernel outputs a record keeps for diagnosing its failure (TestRecord.outputs)
MIN_CELL_EXAMPLES = 3          # Hypothesis examples per (test, implementation, dtype) cell, at least


def cell_minimum(session: "Session", implementation: str, clauses: Iterable[str], dtype: str) -> int:
    """The fewest examples a (test, dtype) cell of a compile-per-shape implementation (example_budget < 1)
    draws: what its clauses still lack of the coverage floor (spec/coverage.toml) after the cells that ran
    before it, the largest over its clauses, at least 1. A cell that ends unsupported leaves the whole
    deficit to the next one citing the clause, so sharing never leaves a clause below the floor that a later
    cell could fill; under xdist each worker counts its own cells. Other implementations draw
    MIN_CELL_EXAMPLES in every cell (for_cases)."""
    return max([MIN_CELL_EXAMPLES - session.floor_checked.get((implementation, c, dtype), 0) for c in set(clauses)]
               + [1])


def refused_at_once(adapter: Any, needs: Iterable[str], dtype: str | None) -> str | None:
    """Why a cell is unsupported before drawing a case: the implementation declares none of a needed
    feature, cannot return an lse to judge in `dtype`, or refuses the cell (Adapter.cell_refusal);
    None if it draws."""
    caps = set(getattr(adapter, "capabilities", ()))
    lacking = [n for n in needs if not caps & set(n.split("|"))]
    if lacking:
        return f"{adapter.name} declares none of {', '.join(lacking)}"
    lse = adapter.lse_refusal(dtype) if "lse" in needs and dtype is not None else None
    if lse:
        return lse
    refusal = getattr(adapter, "cell_refusal", None)
    return refusal(tuple(needs), dtype) if refusal is not None else None


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


class KernelTimeout(KernelError):
    """An in-process kernel call ran past --case-timeout (raised from SIGALRM)."""

    status = "timeout"


@dataclass
class Session:
    """The run's state, built once by the plugin and kept on `config.stash`."""

    backend: str
    impls: list
    divergences: Any                          # conformance.divergences.Divergences
    device: str = "cpu"
    replay: Case | None = None
    long: bool = False
    measure_memory: bool = False
    seed: int | None = None                   # --hypothesis-seed: reseeds even the derandomized ci profile
    case_timeout: float = 60.0                # seconds per kernel call (in-process: SIGALRM; isolated: worker)
    max_timeouts: int = 2                     # after this many timeouts an implementation's calls are skipped
    deadline: float | None = None             # time.time() after which no further test starts (--run-timeout)
    timeouts: dict[str, int] = field(default_factory=dict)
    entries: list = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    # (implementation, clause, dtype) -> examples that checked it so far in cells sharing the floor (cell_minimum)
    floor_checked: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline


@dataclass
class TestRecord:
    """What one test item (test x implementation x dtype cell) saw."""

    nodeid: str
    test: str
    clauses: list[str]
    implementation: str
    dtype: str | None = None
    examples: int = 0                         # calls of the test body (Hypothesis examples, shrinking included)
    checked: int = 0                          # examples in which the kernel ran and was judged
    unsupported: int = 0
    unsupported_reasons: set[str] = field(default_factory=set)
    divergent: int = 0                        # examples in which a declared divergence covered some elements
    divergences: set[str] = field(default_factory=set)
    divergent_by_entry: dict[str, int] = field(default_factory=dict)
    conformed_in_region: dict[str, int] = field(default_factory=dict)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    panel: list[dict[str, Any]] = field(default_factory=list)
    current_case: Case | None = None
    rejected: int = 0                         # unjudged examples handed back to Hypothesis for another draw
    # the latest calls' (case, raw output): Hypothesis re-runs each failing example at the end, and the failure
    # it reports may be an earlier one than the last example run (conformance/engine/causes.py diagnoses it)
    outputs: deque = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))
    # "+"-joined features of the cases a judged example ran ("grads", "dbias" too) -> examples (verdict.credited)
    checked_features: dict[str, int] = field(default_factory=dict)
    _example: dict[str, Any] = field(default_factory=dict)

    def begin_example(self, case) -> None:
        self.examples += 1
        self.current_case = case
        self._example = {"ran": False, "unsupported": False, "entries": set()}

    def end_example(self) -> bool:
        """Close the example; whether the kernel ran on it and its results were judged."""
        ex = self._example
        if ex.get("ran"):
            self.checked += 1
            if "features" in ex:
                sig = "+".join(sorted(ex["features"]))
                self.checked_features[sig] = self.checked_features.get(sig, 0) + 1
        elif ex.get("unsupported"):
            self.unsupported += 1
        if ex.get("entries"):
            self.divergent += 1
            for eid in ex["entries"]:
                self.divergent_by_entry[eid] = self.divergent_by_entry.get(eid, 0) + 1
        self._example = {}
        return bool(ex.get("ran"))

    def output_of(self, case) -> np.ndarray | None:
        """The kernel's latest raw output on `case` (the very object), if still kept."""
        return next((out for c, out in reversed(self.outputs) if c is case), None)

    def note_unsupported(self, reason: str) -> None:
        self.unsupported_reasons.add(reason)
        if self._example:
            self._example["unsupported"] = True
        else:
            self.unsupported += 1

    def note_features(self, case: Any, grads: bool) -> None:
        """What a judged call of this example exercised: the case's features, and gradients if they were asked."""
        if not self._example or not hasattr(case, "features"):
            return
        f = set(case.features()) | ({"grads"} | ({"dbias"} if case.bias is not None else set()) if grads else set())
        self._example["features"] = self._example.get("features", set()) | f

    def note_ran(self) -> None:
        if self._example:
            self._example["ran"] = True
        else:
            self.checked += 1

    def note_divergent(self, entry_id: str) -> None:
        self.divergences.add(entry_id)
        if self._example:
            self._example["entries"].add(entry_id)
        else:
            self.divergent += 1
            self.divergent_by_entry[entry_id] = self.divergent_by_entry.get(entry_id, 0) + 1

    def add_judgement(self, j: tolerance.Judgement, case: Case) -> None:
        """Keep the judgement's error ratios; a non-finite one (NaN or inf where the reference is finite) is
        the worst there is and is kept too, so a summary never shows a small worst ratio beside such failures."""
        r = self.ratios.setdefault(j.dtype, {"max": 0.0, "mean": 0.0, "cases": 0})
        r["max"] = worst(r["max"], j.ratio_max)
        r["mean"] = worst(r["mean"], j.ratio_mean)
        r["cases"] += 1
        if not np.isfinite(j.ratio_max):
            return
        if len(self.samples) < MAX_SAMPLES and hasattr(case, "shape"):
            s = case.shape
            self.samples.append({"dtype": j.dtype, "quantity": j.quantity, "Lq": s["Lq"], "Lk": s["Lk"], "Dk": s["Dk"],
                                 "ratio_max": j.ratio_max, "ratio_mean": j.ratio_mean})


def worst(a: float, b: float) -> float:
    """The larger of two error ratios, NaN counting as the worst."""
    return float("nan") if np.isnan(a) or np.isnan(b) else max(a, b)


class Subject:
    """The implementation under test as a test sees it: the adapter, bound to its record and session.

    Attribute access falls through to the adapter (`impl.name`, `impl.capabilities`, ...)."""

    def __init__(self, adapter: Adapter, record: TestRecord, session: Session):
        self.adapter, self.record, self.session = adapter, record, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)

    def __repr__(self) -> str:
        return f"<Subject {self.adapter.name} for {self.record.test}>"


def _parts(impl: Subject | Adapter) -> tuple[Adapter, TestRecord, Session]:
    if not isinstance(impl, Subject):
        raise RuntimeError("conformance harness used outside a test run by the attnconf plugin "
                           f"(got {type(impl).__name__}, not a Subject)")
    return impl.adapter, impl.record, impl.session


def _name(impl) -> str:
    return impl if isinstance(impl, str) else impl.name


# ---- declaring tests ---------------------------------------------------

def clauses(*ids: str):
    """Mark a test with the spec clauses it checks (checked against spec/clauses.toml)."""
    return pytest.mark.clauses(*ids)


def first(rank: int):
    """Run this test before all unranked ones, lower ranks first: the quick checks that show most bugs at once
    (fixed cases, declared-scope probes), so that a run with -x, or a kernel author watching the terminal,
    sees the first failure within seconds. Order only: the verdict does not depend on it."""
    return pytest.mark.attnconf_first(rank)


def for_cases(strategy, *, examples: Iterable[Case] = (), fixture: str = "impl", weight: float = 1.0,
              dtypes: tuple[str, ...] | None = DTYPES, needs: tuple[str, ...] = (), shares_floor: bool = True):
    """Run the test for Hypothesis-generated cases, one pytest item per implementation and dtype.

    Each (test, implementation, dtype) cell draws its own cases (the strategy's dtype is fixed to the
    cell's and its features to the implementation's declared scope, conformance/strategies.py), has
    its own Hypothesis database key and its own status, so a failure in one dtype never hides the
    others. `dtypes=None` (tests over a fixed list of cases) runs one item over every dtype, judged
    as a whole ("any" cell). `needs` names the features the property is about ("a|b" = either): an
    implementation that declares none of them has the cell unsupported at once, without drawing a
    case. With --replay the test runs the saved case alone. The test takes (impl, case); any extra
    randomness comes from `np.random.default_rng(case.seed)`, so the case alone determines the run.
    `shares_floor=False`: the test's examples count towards its clauses' coverage floor, but the other
    tests citing them do not draw fewer on its account (`cell_minimum`; for a fixed list of pins whose
    count per dtype the test cannot raise). `examples` may be a function of the cell's dtype, called when
    the cell runs (a grid too costly to build at import).
    """
    lazy = examples if callable(examples) else None
    pinned = () if lazy else tuple(examples)

    def decorate(fn: Callable[[Any, Case], None]):
        def test(**kwargs):
            subject: Subject = kwargs[fixture]
            dtype: str | None = kwargs.get("dtype")
            _, rec, session = _parts(subject)
            refusal = refused_at_once(subject.adapter, needs, dtype)
            if refusal:
                pytest.skip(f"unsupported: {refusal}")
            if session.replay is not None:
                return _one_example(fn, subject, session.replay, generated=False)
            # @clauses sits above @for_cases, so its mark is on this wrapper, not on fn
            cited = [c for m in getattr(test, "pytestmark", []) if m.name == "clauses" for c in m.args]
            sharing = (shares_floor and dtype is not None and bool(cited)
                       and getattr(subject.adapter, "example_budget", 1.0) < 1.0)
            least = cell_minimum(session, subject.name, cited, dtype) if sharing else MIN_CELL_EXAMPLES
            share = len(DTYPES) if dtype is not None else 1
            n = max(least, round(hsettings.default.max_examples * weight
                                 * getattr(subject.adapter, "example_budget", 1.0) / share))

            h = given(case=strategy)(cell_body(fn, subject, dtype))
            def top_up(i: int) -> None:       # a test object of its own, under the i-th seed of this cell
                hsettings(hsettings.default, max_examples=TOP_UP_DRAWS)(
                    hseed(zlib.crc32(database_key(fn, subject.name, dtype)) + (session.seed or 0) + i)(
                        given(case=strategy)(cell_body(fn, subject, dtype))))()
            for ex in (lazy(dtype) if lazy else pinned):
                if dtype is None or ex.dtype == dtype:
                    h = example(case=ex)(h)
            h = hsettings(hsettings.default, max_examples=n)(h)
            if session.seed is not None:
                h = hseed(session.seed)(h)
            try:
                with strategies_module.cell(dtype, scope_of(subject.adapter)):
                    try:
                        h()
                        for i in range(TOP_UPS if dtype is not None else 0):
                            if not subject_shortfall(subject.adapter, rec, cited):
                                break
                            top_up(i)
                        return None
                    except Unsatisfiable:
                        if rec.checked:        # some examples were judged: Hypothesis ran out of valid draws
                            return None
                        pytest.skip(f"unsupported: no case of this cell could be run "
                                    f"({'; '.join(sorted(rec.unsupported_reasons)) or 'nothing to judge'})")
            finally:
                if sharing:
                    for c in set(cited):
                        key = (subject.name, c, dtype)
                        session.floor_checked[key] = session.floor_checked.get(key, 0) + rec.checked

        params = (fixture, "dtype") if dtypes is not None else (fixture,)
        test.__signature__ = inspect.Signature([inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                                for p in params])
        test.__name__, test.__qualname__ = fn.__name__, fn.__qualname__
        test.__doc__, test.__module__ = fn.__doc__, fn.__module__
        test.attnconf_dtypes = tuple(dtypes) if dtypes is not None else None
        test.attnconf_fixture = fixture
        test.attnconf_needs = tuple(needs)
        test.attnconf_shares_floor = shares_floor
        if hasattr(fn, "pytestmark"):
            test.pytestmark = fn.pytestmark
        return test
    return decorate


TOP_UP_DRAWS = 12     # extra draws of a cell whose cases exercised a cited clause's subject too rarely
TOP_UPS = 3           # at most this many top-ups, each under its own seed, until the subject reaches the floor


def subject_credit(adapter: Any, rec: TestRecord, cited: Iterable[str]) -> dict[str, int]:
    """Cited clause with a subject (spec/clauses.toml) in the implementation's scope -> the examples of this
    record that exercise it (verdict.credited)."""
    from attnconf.conformance.engine.verdict import credited, out_of_scope, subjects

    declared = {"kind": "sdpa", "features": sorted(getattr(adapter, "capabilities", ()))}
    seen = {"examples_checked": rec.checked, "checked_features": rec.checked_features}
    return {c: credited(seen, subjects()[c]) for c in set(cited)
            if c in subjects() and not out_of_scope(subjects()[c], declared)}


def subject_shortfall(adapter: Any, rec: TestRecord, cited: Iterable[str]) -> bool:
    """Whether a cited clause's subject was exercised by some of this cell's examples, but by fewer than
    MIN_CELL_EXAMPLES: the cell then draws TOP_UP_DRAWS more under another seed, so that a clause the strategy
    does reach is not left below the coverage floor by the luck of the draw. None at all in this cell means
    its strategy is not about the subject: no top-up. The cell alone decides (not the cells that ran before
    it), so a run split over pytest-xdist workers draws what one process draws."""
    return any(0 < n < MIN_CELL_EXAMPLES for n in subject_credit(adapter, rec, cited).values())


def lse_need(impl: Subject, case: Case) -> frozenset[str]:
    """{"lse"} where the implementation returns an lse that can be judged in the case's dtype, else nothing:
    for properties that check the output always and the lse where there is one."""
    adapter = getattr(impl, "adapter", impl)
    if "lse" not in adapter.capabilities or adapter.lse_refusal(case.dtype):
        return frozenset()
    return frozenset({"lse"})


def cell_body(fn: Callable, subject: Subject, dtype: str | None) -> Callable:
    """The function Hypothesis runs for one (test, implementation, dtype) cell. Its database key is the
    test's plus the implementation and dtype, so a failure saved by one cell replays in that cell only."""
    def inner(case):
        return _one_example(fn, subject, case)

    inner._hypothesis_internal_add_digest = database_key(fn, subject.name, dtype)
    return inner


def database_key(fn: Callable, implementation: str, dtype: str | None) -> bytes:
    return f"{fn.__module__}.{fn.__qualname__}|{implementation}|{dtype}".encode()


def _one_example(fn, subject: Subject, case, *, generated: bool = True) -> None:
    rec = subject.record
    rec.begin_example(case)
    try:
        fn(subject, case)
    finally:
        judged = rec.end_example()
    if generated and not judged:
        _give_up_if_never_offered(subject, rec)
        _give_up_if_every_draw_raises(rec)
        # Nothing was judged (the property had nothing to compare on this case, the implementation
        # refused it, or the call raised as a divergence declares): let Hypothesis draw another, so each
        # cell gets its examples' worth of evidence (the coverage floor). This depends on the case alone,
        # so a replayed example behaves the same; a cell where nothing can be judged ends Unsatisfiable,
        # which for_cases records as unsupported.
        rec.rejected += 1
        reject()


OFFER_DRAWS = 20     # draws after which a feature the implementation requires, never offered, ends the cell


def _give_up_if_never_offered(subject: Subject, rec) -> None:
    """An implementation that requires a feature of every case (`requires`, e.g. sinks) cannot run a cell
    whose strategy never gives its cases that feature: after OFFER_DRAWS draws with nothing judged and the
    feature never offered (strategies.offer), the cell is unsupported at once instead of after Hypothesis's
    hundreds of draws. A strategy that offers it at all (even on one draw in two) is never cut short."""
    required = frozenset(getattr(subject.adapter, "requires", frozenset()))
    if not required or rec.checked or rec.divergent or rec.rejected < OFFER_DRAWS - 1:
        return
    unknown = required - strategies_module.REQUIRABLE
    if unknown:
        raise ValueError(f"{subject.name} requires {', '.join(sorted(unknown))} of every case; only "
                         f"{', '.join(sorted(strategies_module.REQUIRABLE))} can be required")
    missing = required - strategies_module.offered()
    if missing:
        pytest.skip(f"unsupported: {subject.name} runs only cases with {', '.join(sorted(missing))}, "
                    f"which this test's cases never have (no {', '.join(sorted(missing))} in {OFFER_DRAWS} draws)")


RAISES_DRAWS = 60    # draws after which a cell whose every case raised as a divergence declares ends


def _give_up_if_every_draw_raises(rec) -> None:
    """A cell whose cases all fall in a declared "raises" entry's case region (Keras on MQA: every case of
    test_mqa_single_kv_head) has nothing else to judge: after RAISES_DRAWS draws, each of which raised as
    declared and none judged, the cell ends with what it has (divergent, each raise checked) instead of
    after Hypothesis's hundreds of draws (459 for each such cell of keras-xla, 26 s, measured). A strategy
    that gives a judgeable case on one draw in five still does so within 60 draws but for a chance of
    1.5e-6."""
    if rec.checked or rec.unsupported or rec.rejected < RAISES_DRAWS - 1 or rec.divergent < rec.rejected + 1:
        return
    entries = ", ".join(sorted(rec.divergences))
    pytest.skip(f"unsupported: every case drawn raised as declared ({entries}): {rec.divergent} draws")


def scope_of(adapter: Adapter) -> dict[str, Any]:
    """The declared scope that generation stays inside: capabilities, dtypes and limits."""
    scope = getattr(adapter, "scope", None)
    declared = dict(scope() if callable(scope) else {})
    declared.update(declared.pop("limits", None) or {})      # adapters/scope.py keeps the limits apart
    dims = declared.get("head_dims")
    max_dim = getattr(adapter, "max_head_dim", None)
    if isinstance(dims, dict):                                 # {"max": N}
        max_dim, dims = dims.get("max", max_dim), None
    return {"features": frozenset(getattr(adapter, "capabilities", frozenset())),
            "dtypes": tuple(getattr(adapter, "dtypes", DTYPES)), "max_head_dim": max_dim,
            "head_dims": tuple(dims) if dims else None,
            "max_seqlen": declared.get("max_seqlen") or getattr(adapter, "max_seqlen", None),
            "contract": getattr(adapter, "contract", None),    # declared length limits (adapters/contract.py)
            "kv_covers_q": declared.get("kv_covers_q", False),
            "palette": palette.on(adapter)}          # shapes from conformance/palette.py (compiles per shape)


# ---- running and judging ----------------------------------------------

@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise KernelTimeout in this (main) thread if the block runs longer than `seconds`."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise KernelTimeout(f"no result after {seconds:g} s (--case-timeout)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def call_kernel(impl: Subject, case, method: Callable[[], Any]) -> Any:
    """Call the kernel under the session's per-call timeout; after `max_timeouts` timeouts of this
    implementation its later calls are not made (status timeout), so a hanging kernel ends the run
    in minutes."""
    adapter, _, session = _parts(impl)
    n = session.timeouts.get(adapter.name, 0)
    if n >= session.max_timeouts:
        raise KernelAborted("timeout", f"not called: {adapter.name} timed out on {n} earlier call(s)", case)
    isolated = hasattr(adapter, "timeout_s")
    try:
        with _deadline(0 if isolated else session.case_timeout):
            return method()
    except KernelError as exc:
        if getattr(exc, "status", None) == "timeout":
            session.timeouts[adapter.name] = n + 1
        raise


def run(impl: Subject, case: Case, *, grads: bool = False, need: Iterable[str] = (),
        divergence: bool = True) -> Result | None:
    """Run `impl` on `case`; None (recorded) if unsupported, or if a declared divergence says the
    call raises and it did. Checks the output contract (ATTN-OP-2 shape, ATTN-OP-5 dtype) on every
    call and the declared divergences' alternatives on the elements they cover."""
    adapter, rec, session = _parts(impl)
    boundaries.note(case)
    try:
        ok = adapter.supports(case, need=frozenset(need) | ({"grads"} if grads else set()))
    except Exception as exc:  # the framework's own capability probe broke on this case
        ok = f"capability check raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        probe_error = True
    else:
        probe_error = False
    applied = session.divergences.applied(adapter.name, case, grads=grads) \
        if divergence and session.divergences is not None and (ok is True or probe_error) else []
    if probe_error:
        if not applied:
            raise ConformanceFailure("ATTN-OP-1", ok, case, adapter.name) from None
        ok = True
    if ok is not True:
        rec.note_unsupported(str(ok))
        return None
    if getattr(case, "dropout_p", 0.0):
        numeric = sorted(a.id for a in applied if getattr(alternatives.ALTERNATIVES.get(a.instead), "numeric", False))
        if numeric:     # its alternative is a reference value; under dropout the kept set is unknown
            rec.note_unsupported(f"dropout on a case a numeric divergence covers ({', '.join(numeric)}): the "
                                 f"dropout mask is unknown, so the declared behaviour cannot be judged element by element")
            return None
    raising = [a for a in applied if a.instead == "raises"]
    try:
        res = call_kernel(impl, case, lambda: adapter.run(case, grads=grads))
    except NotSupported as exc:
        rec.note_unsupported(str(exc))
        return None
    except KernelError as exc:
        status = getattr(exc, "status", None)
        if status in ("crashed", "timeout"):
            raise KernelAborted(status, str(exc), case) from None
        if raising:
            return _raised_as_declared(rec, raising)
        clause = getattr(exc, "clause", None)      # a broken calling-convention contract names its clause
        if clause:
            raise ConformanceFailure(clause, str(exc), case, adapter.name) from None
        raise ConformanceFailure("ATTN-OP-1", f"kernel error: {exc}", case, adapter.name) from None
    except Exception as exc:  # the framework raised inside a trusted adapter: that implementation's failure
        if raising:
            return _raised_as_declared(rec, raising)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ConformanceFailure("ATTN-OP-1", f"raised {type(exc).__name__}: {first}", case, adapter.name) from None
    if not isinstance(res, Result):
        raise ConformanceFailure("ATTN-OP-1", f"adapter returned {type(res).__name__}, not a Result", case, adapter.name)
    if tuple(res.out.shape) != case.out_shape:
        raise ConformanceFailure("ATTN-OP-2", f"output shape {tuple(res.out.shape)} != expected {case.out_shape}",
                                 case, adapter.name)
    rec.outputs.append((case, np.array(res.out, dtype=np.float64)))
    if res.out_dtype != case.dtype:
        widened = [a for a in applied if a.instead == "output_float32" and res.out_dtype == "float32"]
        if not widened:
            raise ConformanceFailure("ATTN-OP-5", f"output dtype {res.out_dtype} != input dtype {case.dtype}",
                                     case, adapter.name)
        for a in widened:
            rec.note_divergent(a.id)
    for a in raising:           # declared to raise, returned instead: judged as usual below (it may have improved)
        observe(impl, a.entry["clause"], a.id, "returned a result where the entry declares that the call raises", case)
    exempt: dict[str, np.ndarray] = {}
    if any(a.entry.get("contract") for a in applied):   # exact properties judge what the kernel returned
        res.notes["raw_out"] = np.array(res.out, copy=True)
    for a in by_specificity(applied):
        if a.instead in ("raises", "returns"):
            continue
        # an element belongs to the most specific entry that covers it (rows before whole cases)
        masks = {q: m & ~exempt[q] if q in exempt else m for q, m in a.masks(case, res).items()}
        if not any(m.any() for m in masks.values()):
            continue
        judged = case
        if a.instead != "scale_float32" and any(b.instead == "scale_float32" for b in applied):
            judged = alternatives.scale_float32_case(case)   # another entry says the scale is a float32
        verdict = alternatives.check(a.entry, judged, res, masks, as_dtype=precision_of(applied, case),
                                     half_accumulated=alternatives.half_accumulated(applied))
        if not verdict.ok:
            raise ConformanceFailure(a.entry["clause"], f"{a.id}: {verdict.detail}", case, adapter.name)
        if not any(m.any() for m in masks.values()):
            continue                # an "or spec" alternative handed every covered element back to be judged
        if verdict.detail:          # the covered elements conform to the spec itself: nothing diverged here
            rec.conformed_in_region[a.id] = rec.conformed_in_region.get(a.id, 0) + 1
        else:
            rec.note_divergent(a.id)
        for q, m in masks.items():
            exempt[q] = m if q not in exempt else exempt[q] | m
    if exempt:
        _substitute(res, case, exempt)
    rec.note_features(case, grads)
    contract = [a for a in applied if a.entry.get("contract")]
    if contract and getattr(res, "out_with_lse", None) is not None:   # the lse call's output answers to it too
        second = dataclasses.replace(res, out=np.asarray(res.out_with_lse), lse=None)
        verdict = alternatives.check(contract[0].entry, case, second, {"out": np.ones(np.shape(second.out), bool)})
        if not verdict.ok:
            raise ConformanceFailure(contract[0].entry["clause"], f"{contract[0].id} (the output of the lse call): "
                                     f"{verdict.detail}", case, adapter.name)
        from attnconf.reference import oracle

        res.out_with_lse = _mark(oracle(case).out.copy(), np.ones(np.shape(second.out), bool))
    rec.note_ran()
    return res


def precision_of(applied: list, case) -> str | None:
    """float32 when an applied entry says the implementation is float32-accurate on this float64 case:
    the other entries' alternatives are then judged at that precision too."""
    if getattr(case, "dtype", None) == "float64" and any(a.instead == "float32_precision" for a in applied):
        return "float32"
    order = alternatives.PRECISION_ORDER            # a declared compute_dtype below the case's dtype
    dtype = getattr(case, "dtype", None)
    lower = [alternatives.PRECISIONS[a.instead] for a in applied if a.instead in alternatives.PRECISIONS]
    return lower[0] if lower and dtype in order and order.index(lower[0]) < order.index(dtype) else None


def by_specificity(applied: list) -> list:
    """Entries with row regions first, then case regions, the catch-all region "any" last; among
    equals, NaN-like alternatives first (a NaN row makes every gradient element it reaches NaN)."""
    return sorted(applied, key=lambda a: (a.rows is None, a.entry["region"] == "any",
                                          a.instead not in ("nan", "non_finite", "non_finite_or_spec")))


def _raised_as_declared(rec: TestRecord, raising: list) -> None:
    for a in raising:
        rec.note_divergent(a.id)
    return None


class Exempt(np.ndarray):
    """An output array whose `exempt` elements a divergence already judged (and set to the spec's values)."""

    exempt: np.ndarray | None = None

    def __array_finalize__(self, obj) -> None:
        self.exempt = None         # views and results of arithmetic carry no exemption


def _mark(arr: np.ndarray, exempt: np.ndarray) -> Exempt:
    out = np.asarray(arr).view(Exempt)
    out.exempt = exempt
    return out


def _substitute(res: Result, case: Case, exempt: dict[str, np.ndarray]) -> None:
    """Put the spec's values into the covered elements (they are judged already) and mark them."""
    from attnconf.reference import oracle

    ref = oracle(case)
    if "out" in exempt:
        res.out = _mark(np.where(exempt["out"], ref.out, res.out), exempt["out"])
    if "lse" in exempt and res.lse is not None:
        res.lse = _mark(np.where(exempt["lse"], ref.lse, res.lse), exempt["lse"])
    if "weights" in exempt and getattr(res, "weights", None) is not None:
        res.weights = _mark(np.where(exempt["weights"], ref.weights, res.weights), exempt["weights"])
    grads = {q: m for q, m in exempt.items() if q in alternatives.GRADIENTS}
    if grads and res.grads:
        from attnconf.reference.backward import backward

        g = backward(case)
        for q, m in grads.items():
            if q in res.grads and getattr(g, q) is not None:
                full = np.broadcast_to(res.grads[q], getattr(g, q).shape)
                res.grads[q] = _mark(np.where(m, getattr(g, q), full), m)


def run_layer(impl: Subject, lc) -> np.ndarray | None:
    """Run a layer implementation on a LayerCase: None (recorded) if unsupported or raising as
    declared; covered elements judged against their divergence and replaced by the reference's."""
    adapter, rec, session = _parts(impl)
    ok = adapter.supports_layer(lc)
    if ok is not True:
        rec.note_unsupported(str(ok))
        return None
    applied = session.divergences.applied(adapter.name, lc) if session.divergences is not None else []
    raising = [a for a in applied if a.instead == "raises"]
    try:
        out = call_kernel(impl, lc, lambda: np.asarray(adapter.run_layer(lc), dtype=np.float64))
    except KernelError as exc:
        if getattr(exc, "status", None) in ("crashed", "timeout"):
            raise KernelAborted(exc.status, str(exc), lc) from None
        if raising:
            return _raised_as_declared(rec, raising)
        raise ConformanceFailure("ATTN-MHA-1", f"kernel error: {exc}", lc, adapter.name) from None
    except Exception as exc:
        if raising:
            return _raised_as_declared(rec, raising)
        raise ConformanceFailure("ATTN-MHA-1", f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                 lc, adapter.name) from None
    res = Result(out=out, out_dtype=lc.dtype)
    exempt = None
    for a in by_specificity(applied):
        if a.instead in ("raises", "returns"):
            continue
        masks = {"out": np.broadcast_to((np.ones(out.shape[:2], bool) if a.rows is None else a.rows)[..., None],
                                        out.shape)} if out.ndim == 3 else {}
        if masks and exempt is not None:
            masks["out"] = masks["out"] & ~exempt
        if not masks or not masks["out"].any():
            continue
        verdict = alternatives.check(a.entry, lc, res, masks)
        if not verdict.ok:
            raise ConformanceFailure(a.entry["clause"], f"{a.id}: {verdict.detail}", lc, adapter.name)
        if verdict.detail:
            rec.conformed_in_region[a.id] = rec.conformed_in_region.get(a.id, 0) + 1
        else:
            rec.note_divergent(a.id)
        exempt = masks["out"] if exempt is None else exempt | masks["out"]
    rec.note_ran()
    if exempt is not None:
        from attnconf.reference.layer import mha

        out = _mark(np.where(exempt, mha(lc), out), exempt)
    return out


# Judgement tags more specific than any clause a test may name for the quantity: a non-finite value, the lse
# of a row that sees no key. A failure keeps them; any other tag gives way to the clause the test names.
SPECIFIC_TAGS = ("ATTN-TOL-3", "ATTN-EMPTY-2")


def judge(j: tolerance.Judgement, case: Case, impl: Subject | str, clause: str | None = None) -> tolerance.Judgement:
    """Record a judgement's error ratios and fail if it does not hold. The failure names `clause` if given
    (unless the judgement's own tag is in SPECIFIC_TAGS), else the judgement's tag; its message carries the
    same id, so the run file's failed clause and the message never disagree."""
    if isinstance(impl, Subject):
        impl.record.add_judgement(j, case)
    if not j.ok:
        text = j.explain()
        own = _clause_of(text)
        chosen = own if clause is None or (text.startswith("[") and own in SPECIFIC_TAGS) else clause
        if text.startswith("["):
            text = text.split("] ", 1)[-1]
        raise ConformanceFailure(chosen, f"[{chosen}] {text}", case, _name(impl))
    return j


def _clause_of(reason: str) -> str:
    return reason[1:reason.index("]")] if reason.startswith("[") else "ATTN-TOL-1"


def expect_close(actual: np.ndarray, case: Case, impl: Subject, *, clause: str | None = None) -> tolerance.Judgement:
    """The forward output agrees with the reference under the tolerance model (ATTN-TOL-1..4)."""
    return judge(tolerance.judge_output(actual, case), case, impl, clause)


def expect_agree(o1: np.ndarray, j1: tolerance.Judgement, o2: np.ndarray, j2: tolerance.Judgement, *, gap: float,
                 clause: str, what: str, case: Case, impl: Subject) -> None:
    """Two kernel outputs agree within both allowances plus `gap`, the distance between their references."""
    o1, o2 = np.asarray(o1), np.asarray(o2)
    finite = np.isfinite(o1) & np.isfinite(o2)
    d = float(np.abs(o1 - o2)[finite].max(initial=0.0))
    allowed = j1.allowed_max + j2.allowed_max + gap
    expect(d <= allowed, clause, f"{what}: outputs differ by {d:.3g} > combined allowance {allowed:.3g}", case, impl)


def expect_equivalent(impl: Subject, case1: Case, case2: Case, *, clause: str, what: str,
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

    return max_gap(oracle(case1).out, oracle(case2).out)


def expect(condition: bool, clause: str, message: str, case: Case | None, impl: Subject | str) -> None:
    if not condition:
        raise ConformanceFailure(clause, message, case, _name(impl))


def expect_raises(impl: Subject, q: np.ndarray, k: np.ndarray, v: np.ndarray, problem: str) -> None:
    """ATTN-OP-6: an invalid call raises. A declared divergence with `instead = "returns"` whose region
    covers the call accepts an output of the expected (B, Hq, Lq, Dv) shape instead."""
    adapter, rec, session = _parts(impl)
    raw = Case(q, k, v, dtype="float32")
    applied = [a for a in (session.divergences.applied(adapter.name, raw) if session.divergences else [])
               if a.instead == "returns" and a.entry["clause"] == "ATTN-OP-6"]
    try:
        out = call_kernel(impl, raw, lambda: adapter.run_raw(q, k, v, "float32"))
    except NotImplementedError:
        pytest.skip(f"{adapter.name} cannot be called on raw shapes")
    except KernelError as exc:
        if getattr(exc, "status", None) in ("crashed", "timeout"):
            raise KernelAborted(exc.status, str(exc), None) from None
        rec.note_ran()
        return
    except Exception:
        rec.note_ran()
        return
    shape = tuple(getattr(out, "shape", ()) or ())
    if applied:
        expected = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        expect(shape == expected, applied[0].entry["clause"],
               f"{applied[0].id}: declared to return an output of shape {expected} instead of raising; "
               f"returned {shape}", None, impl)
        for a in applied:
            rec.note_divergent(a.id)
        return
    expect(False, "ATTN-OP-6", f"{problem}: q {q.shape}, k {k.shape}, v {v.shape} returned {shape or None} "
                               f"instead of raising", None, impl)


def observe(impl: Subject, clause: str, key: str, value: Any, case: Case | None = None) -> None:
    """Record a behaviour for the report (ATTN-NAN-*, ATTN-OP-7): a report row, not a verdict."""
    rec = impl.record
    rec.observations.append({"clause": clause, "implementation": rec.implementation, "key": key,
                             "value": value, "case": case.summary() if case is not None else None})


def record_panel(impl: Subject, entry: dict[str, Any]) -> None:
    impl.record.panel.append(entry)
