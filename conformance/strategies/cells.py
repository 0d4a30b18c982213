"""The cell a strategy draws for: the dtype of the pytest item being run and the declared scope of the
implementation under test, as one explicit value.

Hypothesis builds a test's strategy when the test module is imported, before anyone knows which
implementation and dtype it will run against; the scope is known only when the harness runs a cell. So the
strategies ask, at draw time, the `Cell` that `cell(dtype, scope)` makes current: the harness enters it
around each cell (conformance/engine/harness.py, `for_cases`), and tests of the strategies enter one
themselves. It is the one setter; `current()` is the one reader. Outside any cell the current cell is
`OUTSIDE`: no dtype fixed, every feature allowed, nothing recorded as offered.

Every strategy draws its dtype with `dtype_choice` and asks `allows(feature)` before it draws a feature, so
cases stay inside what the implementation declares (ATTN-SCOPE-1) and inside the cell's dtype. Drawing
happens on the thread that runs the test, the one that entered the cell.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from hypothesis import reject
from hypothesis import strategies as st

from attnconf.reference import DTYPES, Case


# features an implementation may require of every case (Implementation.requires): the strategies that can
# add one say so through `offer`, so that a cell whose strategy never does is unsupported at once
REQUIRABLE = frozenset({"sinks"})


@dataclass(frozen=True)
class Cell:
    """What is being generated for. `dtype`: the pytest item's dtype, None to draw one. `scope`: the
    implementation's declared scope as the harness states it (`harness.scope_of`: features, dtypes,
    head_dims, max_head_dim, max_seqlen, contract, kv_covers_q, palette), None to allow everything.
    `offered`: the REQUIRABLE features this cell's strategies have offered so far (None: not recorded)."""

    dtype: str | None = None
    scope: Mapping[str, Any] | None = None
    offered: set[str] | None = None

    def allows(self, *features: str) -> bool:
        """Whether the scope declares every one of `features`."""
        return self.scope is None or all(f in self.scope["features"] for f in features)

    def limit(self, name: str) -> Any:
        """The scope's entry `name` (a limit such as max_seqlen, or a switch such as palette); None if unset."""
        return None if self.scope is None else self.scope.get(name)


OUTSIDE = Cell()
_current: Cell = OUTSIDE


def current() -> Cell:
    """The cell being generated for (OUTSIDE when no cell is entered)."""
    return _current


@contextlib.contextmanager
def cell(dtype: str | None, scope: Mapping[str, Any] | None) -> Iterator[Cell]:
    """Generate for one dtype and inside one declared scope until the block ends (see the module docstring)."""
    global _current
    before, _current = _current, Cell(dtype, scope, set())
    try:
        yield _current
    finally:
        _current = before


def offer(feature: str) -> None:
    """Note that the strategy drawing now could have given its case `feature` (a REQUIRABLE one)."""
    if _current.offered is not None:
        _current.offered.add(feature)


def offered() -> frozenset[str]:
    """The REQUIRABLE features the strategies of the current cell have offered so far."""
    return frozenset(_current.offered or ())


def allows(*features: str) -> bool:
    """Whether the implementation under test declares every one of `features`."""
    return _current.allows(*features)


def limit(name: str) -> Any:
    """The current cell's scope entry `name` (None outside a cell or where the scope does not set it)."""
    return _current.limit(name)


@st.composite
def declared_choice(draw, options: dict[str, str]) -> str:
    """One of `options` (name -> the feature it needs) that the implementation declares, rejecting the draw
    if it declares none: a strategy that hides keys by a mask, a bias or lengths draws only the ways the
    kernel can take."""
    mine = tuple(name for name, feature in options.items() if allows(feature))
    if not mine:
        reject()
    return draw(st.sampled_from(mine))


@st.composite
def dtype_choice(draw, dtypes: tuple[str, ...] = DTYPES) -> str:
    """The cell's dtype (rejecting the example if this strategy cannot make it), or a drawn one."""
    fixed = _current.dtype
    if fixed is None:
        return draw(st.sampled_from(dtypes))
    if fixed not in dtypes:
        reject()
    return fixed


@st.composite
def fixed_cases(draw, pool: tuple[Case, ...] | list[Case]) -> Case:
    """One of the given fixed cases, of the cell's dtype (`pool` may be a function of that dtype)."""
    fixed = _current.dtype
    mine = [c for c in (pool(fixed) if callable(pool) else pool) if fixed is None or c.dtype == fixed]
    if not mine:
        reject()
    return draw(st.sampled_from(mine))


def dtypes_of(pool) -> tuple[str, ...]:
    """The dtypes a list of fixed cases covers, in the spec's order."""
    return tuple(d for d in DTYPES if any(c.dtype == d for c in pool))
