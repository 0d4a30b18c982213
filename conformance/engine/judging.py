"""Judging what a kernel returned: the `expect*` statements a test is written in, and `judge`, which
records a tolerance judgement's error ratios on the test's record and fails its clause if it does not hold.

Every failure is a `ConformanceFailure` whose message starts with the clause id, so the run file's failed
clause and the message never disagree.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.conformance.engine import tolerance
from attnconf.conformance.engine.kernel_call import invoke, run
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.engine.outcomes import ConformanceFailure
from attnconf.conformance.engine.session import Subject, name_of, parts
from attnconf.reference import Case

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
        raise ConformanceFailure(chosen, f"[{chosen}] {text}", case, name_of(impl))
    return j


def _clause_of(reason: str) -> str:
    return reason[1:reason.index("]")] if reason.startswith("[") else "ATTN-TOL-1"


def expect(condition: bool, clause: str, message: str, case: Case | None, impl: Subject | str) -> None:
    """The spec's statement `condition` holds, else `clause` fails with `message`."""
    if not condition:
        raise ConformanceFailure(clause, message, case, name_of(impl))


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
    j1 = expect_close(r1.out, case1, impl, clause=clause1 or clause)
    j2 = expect_close(r2.out, case2, impl, clause=clause)
    expect_agree(r1.out, j1, r2.out, j2, gap=reference_gap(case1, case2), clause=clause, what=what,
                 case=case2, impl=impl)


def reference_gap(case1: Case, case2: Case) -> float:
    """max |O_ref(case1) - O_ref(case2)|: how far two cases' exact answers are apart."""
    from attnconf.reference import oracle

    return max_gap(oracle(case1).out, oracle(case2).out)


def expect_raises(impl: Subject, q: np.ndarray, k: np.ndarray, v: np.ndarray, problem: str) -> None:
    """ATTN-OP-6: an invalid call raises. A declared divergence with `instead = "returns"` whose region
    covers the call accepts an output of the expected (B, Hq, Lq, Dv) shape instead."""
    adapter, rec, session = parts(impl)
    raw = Case(q, k, v, dtype="float32")
    applied = [a for a in (session.divergences.applied(adapter.name, raw) if session.divergences else [])
               if a.instead == "returns" and a.entry["clause"] == "ATTN-OP-6"]
    try:
        out = invoke(impl, raw, form="raw")
    except NotImplementedError:
        pytest.skip(f"{adapter.name} cannot be called on raw shapes")
    except Exception:          # it raised, as the spec says it must
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
