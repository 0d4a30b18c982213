"""Every branch point of real kernels, in every family of inputs (ATTN-OP-1, ATTN-TOL-1..5).

Kernels choose a code path by shape: a second query or key tile, the split-KV path of a short query block
over a long history, a head-dim template, GQA packing, batch blocking. Each boundary of
conformance/strategies/boundaries.py runs here in the plain, GQA, windowed, ALiBi (signed geometric slopes), sink,
gradient and causal families (conformance/strategies/branch_cases.py), in every dtype the cell runs, fitted to the
declared scope.
The output is judged against the reference, the lse where the kernel returns one, the gradients where the
family asks for them; a failure names its boundary and family, so a defect on one path reads as that path.
Under the dev and ci profiles each (boundary, family) runs once, in one of the implementation's dtypes in
turn (the tolerance model's emulated baselines of the whole grid in every dtype cost about a minute); under
thorough, in every dtype. An implementation that compiles every new shape runs each boundary in one family,
in turn, under dev and ci (the whole grid took jax 84 s of CPU: one compiled program per case).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import functools

from attnconf.conformance import strategies as st
from attnconf.conformance.strategies import palette
from attnconf.conformance.strategies.boundaries import BOUNDARIES
from attnconf.conformance.strategies.branch_cases import BRANCH_FAMILIES, branch_grid, where
from attnconf.conformance.engine.harness import ConformanceFailure, clauses, for_cases, judge, lse_need, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_gradients, judge_lse, judge_output

LSE_CLAUSE = {"alibi": "ATTN-ALIBI-2", "sinks": "ATTN-SINK-2"}     # the family's lse clause; else the judgement's own
BOUNDARY_INDEX = {b.id: i for i, b in enumerate(BOUNDARIES)}
FAMILY_CLAUSE = {"plain": None, "gqa": "ATTN-GQA-1", "window": "ATTN-WIN-1", "alibi": "ATTN-ALIBI-1",
                 "sinks": "ATTN-SINK-1", "gradients": None, "causal": "ATTN-CAUSAL-1",
                 "causal_gradients": "ATTN-CAUSAL-1"}


@functools.lru_cache(maxsize=None)
def grid(dtype: str | None) -> tuple:
    dtypes = st.DTYPES if dtype is None else (dtype,)
    return tuple(c for d in dtypes for _, _, c in branch_grid(d))


@functools.lru_cache(maxsize=None)
def _place(dtype: str) -> dict[int, tuple[int, int, str]]:
    """Grid case seed -> (boundary index, family index, family)."""
    return {c.seed: (BOUNDARY_INDEX[b], BRANCH_FAMILIES.index(f), f) for b, f, c in branch_grid(dtype)}


def _runs_here(impl, case) -> bool:
    """Whether this cell runs the grid case. Under the thorough profile every cell runs every case. Otherwise
    each (boundary, family) runs once, in one of the implementation's dtypes: dtype number (boundary + family)
    mod their count, so every boundary still meets every dtype (through its families) and every family every
    dtype (through the boundaries). An implementation that compiles every new shape (example_budget < 1)
    runs each boundary in one family, the families in turn (one compiled program per boundary, not six)."""
    if palette.wide():
        return True
    mine = [d for d in st.DTYPES if d in impl.dtypes]
    b, f, _ = _place(case.dtype).get(case.seed, (0, 0, ""))
    if getattr(impl, "example_budget", 1.0) < 1:
        present = sorted(fi for bi, fi, _ in _place(case.dtype).values() if bi == b)
        if f != present[b % len(present)]:
            return False
    return not mine or case.dtype == mine[(b + f) % len(mine)]


@clauses("ATTN-OP-1", "ATTN-TOL-1", "ATTN-TOL-2", "ATTN-TOL-3", "ATTN-TOL-4", "ATTN-TOL-5")
@for_cases(st.fixed_cases(grid), examples=grid, weight=0.01, shares_floor=False)
def test_each_boundary_in_each_family(impl, case):
    """At each branch point, in each family, the output (and the lse and gradients where there are) agree
    with the reference."""
    if not _runs_here(impl, case):
        return
    family = _place(case.dtype).get(case.seed, (0, 0, "plain"))[2]
    grads = case.grad_out is not None
    fitted = fit(case, impl, need=("grads",) if grads else ())
    if fitted is None:
        run(impl, case, grads=grads)            # records why the case lies outside the scope
        return
    res = run(impl, fitted, grads=grads)
    clause = FAMILY_CLAUSE[family]
    try:
        judge(judge_output(res.out, fitted), fitted, impl, clause)
        if lse_need(impl, fitted):
            judge(judge_lse(res.lse, fitted), fitted, impl, LSE_CLAUSE.get(family))
        if grads and res.grads is not None:
            for j in judge_gradients(res.grads, fitted):
                judge(j, fitted, impl)
    except ConformanceFailure as failure:
        here = where(case)
        if here:
            head, _, rest = str(failure).partition("\n")
            failure.args = (f"{head} (at {here})" + (f"\n{rest}" if rest else ""),)
        raise
