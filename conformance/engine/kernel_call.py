"""The one call path into a kernel, and the calls the suite makes through it.

`invoke` is the only place that calls an adapter's `run`, `run_layer` or `run_raw`: tests (through
`run`, `run_layer` and `judging.expect_raises`), the declared-scope probes, the witnesses of declared
divergences and --replay all come here, so every call is under the session's per-call timeout, a hanging
implementation stops being called after `max_timeouts`, and a crash or a hang ends the test as
`KernelAborted` the same way wherever the call came from.

`run` and `run_layer` end an example that has nothing to judge by raising `Unsupported` or
`RaisedAsDeclared` (conformance/engine/outcomes.py), after recording why on the test's record: a test
body never sees a missing result.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from typing import Any, Iterable, NoReturn

import numpy as np

from attnconf.adapters import KernelError, Result
from attnconf.adapters.base import NotSupported
from attnconf.conformance.strategies import boundaries
from attnconf.conformance.engine import alternatives
from attnconf.conformance.engine.covered import judge_covered, mark, precision_of, substitute
from attnconf.conformance.engine.outcomes import (ConformanceFailure, KernelAborted, KernelTimeout,
                                                   RaisedAsDeclared, Unsupported)
from attnconf.conformance.engine.session import Subject, TestRecord, observe, parts
from attnconf.reference import Case

FORMS = ("sdpa", "layer", "raw")     # adapter.run(case), adapter.run_layer(layer_case), adapter.run_raw(q, k, v)


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


def invoke(impl: Subject, case: Any, *, form: str = "sdpa", grads: bool = False) -> Any:
    """Call the kernel once, under the session's per-call timeout: `form` "sdpa" returns the adapter's
    Result, "layer" a Result of the layer's float64 output, "raw" whatever `run_raw` returned on the case's
    q, k, v (an invalid call has no Case to replay: its abort carries none). A crash or a timeout raises
    KernelAborted; after `max_timeouts` timeouts of this implementation its later calls are not made, so a
    hanging kernel ends the run in minutes. Anything else the kernel raises is the caller's to judge."""
    if form not in FORMS:
        raise ValueError(f"unknown call form {form!r}: one of {', '.join(FORMS)}")
    adapter, _, session = parts(impl)
    shown = None if form == "raw" else case
    n = session.timeouts.get(adapter.name, 0)
    if n >= session.max_timeouts:
        raise KernelAborted("timeout", f"not called: {adapter.name} timed out on {n} earlier call(s)", shown)
    isolated = hasattr(adapter, "timeout_s")
    try:
        with _deadline(0 if isolated else session.case_timeout):
            if form == "layer":
                return Result(out=np.asarray(adapter.run_layer(case), dtype=np.float64), out_dtype=case.dtype)
            if form == "raw":
                return adapter.run_raw(case.q, case.k, case.v, case.dtype)
            return adapter.run(case, grads=grads)
    except KernelError as exc:
        status = getattr(exc, "status", None)
        if status == "timeout":
            session.timeouts[adapter.name] = n + 1
        if status in ("crashed", "timeout"):
            raise KernelAborted(status, str(exc), shown) from None
        raise


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


def _raised(rec: TestRecord, raising: list, exc: BaseException, clause: str, case, impl_name: str) -> NoReturn:
    """A call that raised: as a declared divergence says (recorded, the example ends), or a failure of
    `clause` (or of the calling-convention contract the error names)."""
    if raising:
        for a in raising:
            rec.note_divergent(a.id)
        raise RaisedAsDeclared(", ".join(a.id for a in raising))
    named = getattr(exc, "clause", None)      # a broken calling-convention contract names its clause
    if named:
        raise ConformanceFailure(named, str(exc), case, impl_name) from None
    if isinstance(exc, KernelError):
        raise ConformanceFailure(clause, f"kernel error: {exc}", case, impl_name) from None
    raise ConformanceFailure(clause, f"raised {type(exc).__name__}: {_first_line(exc)}", case, impl_name) from None


def unsupported(rec: TestRecord, reason: str) -> Unsupported:
    """Record an unsupported example and return the outcome to raise."""
    rec.note_unsupported(reason)
    return Unsupported(reason)


def run(impl: Subject, case: Case, *, grads: bool = False, need: Iterable[str] = (),
        divergence: bool = True) -> Result:
    """Run `impl` on `case` and return its Result. Raises Unsupported (recorded) if the case is outside the
    implementation's scope, and RaisedAsDeclared (recorded) if a declared divergence says the call raises and
    it did. Checks the output contract (ATTN-OP-2 shape, ATTN-OP-5 dtype) on every call and the declared
    divergences' alternatives on the elements they cover."""
    adapter, rec, session = parts(impl)
    boundaries.note(case)
    try:
        ok = adapter.supports(case, need=frozenset(need) | ({"grads"} if grads else set()))
    except Exception as exc:  # the framework's own capability probe broke on this case
        ok = f"capability check raised {type(exc).__name__}: {_first_line(exc)}"
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
        raise unsupported(rec, str(ok))
    if getattr(case, "dropout_p", 0.0):
        numeric = sorted(a.id for a in applied if getattr(alternatives.ALTERNATIVES.get(a.instead), "numeric", False))
        if numeric:     # its alternative is a reference value; under dropout the kept set is unknown
            raise unsupported(rec, f"dropout on a case a numeric divergence covers ({', '.join(numeric)}): the "
                                   f"dropout mask is unknown, so the declared behaviour cannot be judged element by element")
    raising = [a for a in applied if a.instead == "raises"]
    try:
        res = invoke(impl, case, grads=grads)
    except NotSupported as exc:
        raise unsupported(rec, str(exc)) from None
    except Exception as exc:  # the framework raised inside a trusted adapter: that implementation's failure
        _raised(rec, raising, exc, "ATTN-OP-1", case, adapter.name)
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
    if any(a.entry.get("contract") for a in applied):   # exact properties judge what the kernel returned
        res.notes["raw_out"] = np.array(res.out, copy=True)
    as_dtype, half = precision_of(applied, case), alternatives.half_accumulated(applied)
    scaled = any(b.instead == "scale_float32" for b in applied)

    def check(a, masks):
        judged = alternatives.scale_float32_case(case) if scaled and a.instead != "scale_float32" else case
        return alternatives.check(a.entry, judged, res, masks, as_dtype=as_dtype, half_accumulated=half)

    exempt = judge_covered(rec, applied, case, res, adapter.name, lambda a: a.masks(case, res), check)
    if exempt:
        substitute(res, case, exempt)
    rec.note_features(case, grads)
    contract = [a for a in applied if a.entry.get("contract")]
    if contract and getattr(res, "out_with_lse", None) is not None:   # the lse call's output answers to it too
        second = dataclasses.replace(res, out=np.asarray(res.out_with_lse), lse=None)
        verdict = alternatives.check(contract[0].entry, case, second, {"out": np.ones(np.shape(second.out), bool)})
        if not verdict.ok:
            raise ConformanceFailure(contract[0].entry["clause"], f"{contract[0].id} (the output of the lse call): "
                                     f"{verdict.detail}", case, adapter.name)
        from attnconf.reference import oracle

        res.out_with_lse = mark(oracle(case).out.copy(), np.ones(np.shape(second.out), bool))
    rec.note_ran()
    return res


def run_layer(impl: Subject, lc) -> np.ndarray:
    """Run a layer implementation on a LayerCase and return its float64 output: Unsupported or
    RaisedAsDeclared (recorded) as `run`; covered elements judged against their divergence and replaced
    by the reference's."""
    adapter, rec, session = parts(impl)
    ok = adapter.supports_layer(lc)
    if ok is not True:
        raise unsupported(rec, str(ok))
    applied = session.divergences.applied(adapter.name, lc) if session.divergences is not None else []
    raising = [a for a in applied if a.instead == "raises"]
    try:
        res = invoke(impl, lc, form="layer")
    except Exception as exc:
        _raised(rec, raising, exc, "ATTN-MHA-1", lc, adapter.name)
    out = res.out

    def masks_of(a) -> dict[str, np.ndarray]:
        if out.ndim != 3:
            return {}
        return {"out": np.broadcast_to((np.ones(out.shape[:2], bool) if a.rows is None else a.rows)[..., None],
                                       out.shape)}

    exempt = judge_covered(rec, applied, lc, res, adapter.name, masks_of,
                           lambda a, masks: alternatives.check(a.entry, lc, res, masks), handed_back=False)
    rec.note_ran()
    if exempt:
        from attnconf.reference.layer import mha

        out = mark(np.where(exempt["out"], mha(lc), out), exempt["out"])
    return out


def lse_need(impl: Subject, case: Case) -> frozenset[str]:
    """{"lse"} where the implementation returns an lse that can be judged in the case's dtype, else nothing:
    for properties that check the output always and the lse where there is one."""
    adapter = getattr(impl, "adapter", impl)
    if "lse" not in adapter.capabilities or adapter.lse_refusal(case.dtype):
        return frozenset()
    return frozenset({"lse"})
