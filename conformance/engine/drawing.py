"""The test decorators and the drawing of cases: `clauses`, `first` and `for_cases`, which turns a
property `fn(impl, case)` into one pytest item per (test, implementation, dtype) cell, each drawing its own
Hypothesis cases inside the implementation's declared scope, with its own database key and status.

How many examples a cell draws lives here too (the coverage floor a cell shares with the cells citing the
same clauses, top-ups for subjects drawn too rarely, giving up early where nothing can be judged), and so
does the example loop: an example whose call gave no result (`outcomes.NoResult`, recorded by the call)
judged nothing, and Hypothesis draws another.
"""
from __future__ import annotations

import inspect
import zlib
from typing import Any, Callable, Iterable

import pytest
from hypothesis import example, given, reject
from hypothesis import seed as hseed
from hypothesis import settings as hsettings
from hypothesis.errors import Unsatisfiable

from attnconf.adapters import Adapter
from attnconf.conformance.strategies import palette
from attnconf.conformance import strategies as strategies_module
from attnconf.conformance.engine.outcomes import NoResult
from attnconf.conformance.engine.session import Session, Subject, TestRecord, parts
from attnconf.reference import DTYPES, Case

MIN_CELL_EXAMPLES = 3          # Hypothesis examples per (test, implementation, dtype) cell, at least


def cell_minimum(session: Session, implementation: str, clauses: Iterable[str], dtype: str) -> int:
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
    cell's and its features to the implementation's declared scope, conformance/strategies/), has
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
            _, rec, session = parts(subject)
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
            draws = draw_seed(fn, dtype)
            def top_up(i: int) -> None:       # a test object of its own, under the i-th seed of this cell
                hsettings(hsettings.default, max_examples=TOP_UP_DRAWS)(
                    hseed(draws + (session.seed or 0) + i)(
                        given(case=strategy)(cell_body(fn, subject, dtype))))()
            for ex in (lazy(dtype) if lazy else pinned):
                if dtype is None or ex.dtype == dtype:
                    h = example(case=ex)(h)
            h = hsettings(hsettings.default, max_examples=n)(h)
            if session.seed is not None:
                h = hseed(session.seed)(h)
            elif hsettings.default.derandomize:
                h = hseed(draws)(h)
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


def cell_body(fn: Callable, subject: Subject, dtype: str | None) -> Callable:
    """The function Hypothesis runs for one (test, implementation, dtype) cell. Its database key is the
    test's plus the implementation and dtype, so a failure saved by one cell replays in that cell only."""
    def inner(case):
        return _one_example(fn, subject, case)

    inner._hypothesis_internal_add_digest = database_key(fn, subject.name, dtype)
    return inner


def database_key(fn: Callable, implementation: str, dtype: str | None) -> bytes:
    return f"{fn.__module__}.{fn.__qualname__}|{implementation}|{dtype}".encode()


def draw_seed(fn: Callable, dtype: str | None) -> int:
    """The seed of a cell's draws under a derandomized profile (ci), and of its top-ups: the test's and the
    dtype's, not the implementation's. Two implementations with the same declared scope then draw the same
    cases, and a process that runs both (the catalogue, `make report`'s implementations of one backend)
    emulates each case's baseline once (reference/emulate.py, the shared baselines). A bug is caught on the
    cases of its own run either way; the implementation still keys the database, which replays a failure in
    its own cell."""
    return zlib.crc32(f"{fn.__module__}.{fn.__qualname__}|{dtype}".encode())


def _one_example(fn, subject: Subject, case, *, generated: bool = True) -> None:
    """One example of a cell: the property on one case. A call that gave no result ends the example (its
    record says why); an example that judged nothing is handed back to Hypothesis for another draw."""
    rec = subject.record
    rec.begin_example(case)
    try:
        fn(subject, case)
    except NoResult:
        pass
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
            "palette": palette.on(adapter)}          # shapes from conformance/strategies/palette.py (compiles per shape)
