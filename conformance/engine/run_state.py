"""The state of one attnconf run, in one object kept on pytest's config.

Everything a run accumulates lives on `RunState`: the harness session the options built, the records
as they arrive, when the run file was last written and what that cost, the environment and the plan
(computed once, from the suite modules pytest collected), which failing cases are saved (the causes' keeper), whether the run was stopped, the
garbage-collector settings to restore, and the final run file. Nothing is kept in module globals, so
two runs in one process (pytest.main twice, the project's own tests) never see each other's state.
"""
from __future__ import annotations

import gc
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from attnconf.conformance.engine import run_file

if TYPE_CHECKING:
    from attnconf.conformance.engine import harness

GC_FULL_AFTER = 100


class RunState:
    """What one run keeps: the harness session and, on the controller, the records as they arrive, the
    environment and the run file. On the controller it is also registered as a plugin, so that
    `pytest_runtest_logreport` (which gets no config) reaches it without any module global."""

    def __init__(self, session: harness.Session, config: pytest.Config):
        self.session = session
        self.config = config
        self.records: list[dict[str, Any]] = []
        self.started = time.time()
        self.last_write = 0.0
        self.write_cost = 0.0
        self.gc_restore: tuple[tuple[int, int, int], bool] | None = None   # thresholds, whether we froze
        self.run: dict[str, Any] | None = None
        self.interrupted = False
        self.environment: dict[str, Any] | None = None
        self.plan: list | None = None
        self.suite_modules: dict[str, Any] = {}  # the suite's test modules pytest collected, by real path (plan.py)
        self.keeper: Any = None                 # conformance.causes.Keeper: which failing cases are saved
        self.failed = 0
        self.unvalidated_said = False           # the run file was written unvalidated, and that was said once

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect records (with and without pytest-xdist) and keep the run file current."""
        got = False
        for key, value in report.user_properties:
            if key == "attnconf":
                self.records.append(value)
                got = True
        if report.failed:
            self.failed += 1
        if got and not self._stopping_failure():
            run_file.write_partial(self)

    def _stopping_failure(self) -> bool:
        """Whether this failure is the one that stops the run (-x, --maxfail): the final run file is written
        at once, so a partial write now would only validate the file twice (one validation of a -x run's file:
        0.57 s, measured under load)."""
        maxfail = getattr(self.config.option, "maxfail", 0) or 0
        return 0 < maxfail <= self.failed

    def install_sigterm(self) -> None:
        """SIGTERM stops the run like Ctrl-C: pytest finishes the session and the run file is written."""
        def stop(signum, frame):
            self.interrupted = True
            run_file.write_partial(self, force=True)
            raise KeyboardInterrupt("SIGTERM")

        try:
            signal.signal(signal.SIGTERM, stop)
        except ValueError:  # not the main thread
            pass

    def lighten_gc(self) -> None:
        """Lighter garbage collection for the run (only when attnconf runs): a run's heap grows with every
        shape a compile-per-shape framework compiles (a jax ci run: 2.4 GB, 1260 XLA executables) and
        each full collection rescans all of it (20 of them, 3.8 s of a 97 s jax run, measured). What is
        alive once collection ends is frozen, and a full collection waits for GC_FULL_AFTER younger ones
        instead of 10 (2.3 s of collection in that run); `restore_gc` restores both. A process that
        froze objects itself keeps its own freezing."""
        if self.gc_restore is not None:
            return
        froze = gc.get_freeze_count() == 0
        if froze:
            gc.freeze()
        t0, t1, t2 = gc.get_threshold()
        self.gc_restore = ((t0, t1, t2), froze)
        gc.set_threshold(t0, t1, GC_FULL_AFTER)

    def restore_gc(self) -> None:
        if self.gc_restore is not None:
            thresholds, froze = self.gc_restore
            gc.set_threshold(*thresholds)
            if froze:
                gc.unfreeze()
            self.gc_restore = None


SESSION_KEY = pytest.StashKey[RunState]()


def state(config: pytest.Config) -> RunState | None:
    """The run's state, or None when attnconf is inert (no --backend)."""
    return config.stash.get(SESSION_KEY, None)
