"""How one call of a kernel, or one example of a test, can end other than with a result to judge.

Each is an exception, so a test body reads as a statement of the spec: it calls `run` and judges what
comes back, and never guards against "no result". The engine owns every ending here: the example loop
(conformance/engine/drawing.py) takes `NoResult` as "this example judged nothing" and draws another,
the plugin records `ConformanceFailure` as a failure of its clause and `KernelAborted` as a crash or
a timeout. `NoResult` is recorded on the test's record before it is raised, so nothing is lost when a
test does not catch it.
"""
from __future__ import annotations

from attnconf.adapters import KernelError
from attnconf.reference import Case


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


class NoResult(BaseException):
    """The call gave nothing to judge, and the test's record already says why. The example ends here:
    the engine lets Hypothesis draw another case (drawing.py); a test outside Hypothesis ends as if it
    returned (the plugin's pytest_runtest_call). BaseException, like KernelAborted, so that a test's own
    `except Exception` around a call (a kernel that raises is recorded too) never takes it for an error
    of the kernel; a test that goes on after an unsupported call (a loop over dtypes) catches it by name."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class Unsupported(NoResult):
    """The implementation does not run this case: outside its declared scope, or refused by the kernel
    (NotSupported), or not judgeable as declared (recorded as an unsupported example)."""


class RaisedAsDeclared(NoResult):
    """The call raised, and a declared divergence says it does on this case (recorded as divergent)."""
