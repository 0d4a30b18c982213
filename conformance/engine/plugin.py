"""The attnconf pytest plugin: the hooks through which pytest drives a conformance run.

A checkout loads it from the root conftest.py; an installed attnconf loads it through its `pytest11` entry
point (registered under the same name, `attnconf.conformance.engine.plugin`, so never twice). It is inert
unless `--backend` is given: installing attnconf never changes anybody else's test run, and only collecting
attnconf's own conformance tests without `--backend` is a usage error.

Flow: configure (options.py validates the options and builds the harness session; run_state.py's `RunState`
keeps it on config.stash) -> parametrize tests over implementations and dtype cells -> each test's `impl`
fixture is a `harness.Subject` bound to the item's own `TestRecord` -> records.py turns the outcome into a
record (pass / fail / error / unsupported / divergent / crashed / timeout / not_run) -> run_file.py writes
the run file as records arrive (so a stopped run keeps what it has, verdict INCOMPLETE) -> at the end,
cells (cells.py), verdict (verdict.py), the final run file and the summary (summary.py).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from attnconf.spec.vocabulary import FAILING, PROFILES  # noqa: F401  (importable from here as before)

from attnconf.conformance.engine import run_file
from attnconf.conformance.engine.cells import kind as _kind
from attnconf.conformance.engine.options import (  # noqa: F401  (importable from here as before)
    DEFAULT_RUN_TIMEOUT_S, SUITE_INI, add_options, build_session, register_profiles, usage as _usage,
    wants_profiles, by_cli as _by_cli)
from attnconf.conformance.engine.records import (  # noqa: F401
    RECORD_KEY, RESULT_KEY, cause as _cause, clauses_of as _clauses_of, clear_saved_failures, failures_dir,
    impl_of as _impl_of, primary as _primary, record as _record, replay_command as _replay_command,
    save_failure as _save_failure, skip_reason as _skip_reason, with_record as _with_record)
from attnconf.conformance.engine.run_file import WRITE_COST_SHARE, WRITE_EVERY_S  # noqa: F401
from attnconf.conformance.engine.run_state import GC_FULL_AFTER, SESSION_KEY, RunState  # noqa: F401
from attnconf.conformance.engine.run_state import state as _state
from attnconf.conformance.engine.summary import ratio_tail, write_summary  # noqa: F401

if TYPE_CHECKING:   # the rest is imported when a run starts: an inert plugin costs no NumPy import
    from attnconf.conformance.engine import harness

SUITE_DIR = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before Hypothesis' own plugin loads the profile named by --hypothesis-profile
    if wants_profiles(config):
        register_profiles()
    config.addinivalue_line("markers", "clauses(*ids): spec clauses this test checks")
    config.addinivalue_line("markers", "attnconf_opt_in: an attnconf test that runs only when its option is given")
    config.addinivalue_line("markers", "attnconf_first(rank): an attnconf test that runs before the others")
    if not config.getoption("--backend"):
        return  # inert: attnconf acts only when its options are given (see pytest_collection_modifyitems)
    from hypothesis import settings

    state = RunState(build_session(config), config)
    config.stash[SESSION_KEY] = state
    if _by_cli(config):     # pytest's own lines name tests from the caller's folder: ../../site-packages/...
        config.cwd_relative_nodeid = lambda nodeid: nodeid
    settings.load_profile(config.getoption("--hypothesis-profile", default=None) or "dev")
    if getattr(config, "workerinput", None) is None:
        config.pluginmanager.register(state, "attnconf-run")
        state.install_sigterm()
        if config.getoption("--report") and not config.getoption("--failures-dir") and state.session.replay is None:
            clear_saved_failures(failures_dir(config))    # a replay keeps its case


# ---- collection and parametrization ------------------------------------------------------------

def pytest_itemcollected(item: pytest.Item) -> None:
    """Keep the suite's test modules as pytest imported them, deselected items' too: the verdict's plan reads
    their declarations from them (plan.py) instead of importing them again."""
    state = _state(item.config)
    module = getattr(item, "module", None)
    if state is not None and module is not None and Path(str(item.path)).resolve().parent == SUITE_DIR:
        state.suite_modules.setdefault(os.path.realpath(module.__file__), module)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Lighter garbage collection for the run (only when attnconf runs; RunState.lighten_gc says why)."""
    state = _state(session.config)
    if state is not None:
        state.lighten_gc()


# Under pytest-xdist (`-n 2`), the attnconf run schedules one dtype per worker at a time, heaviest first,
# instead of test by test: a compile-per-shape framework compiles each (shape, dtype) once instead of
# once per worker, and every clause x dtype cell of an implementation runs in one worker, so the
# coverage floor that cells share (harness.cell_minimum) counts exactly as in one process.
DTYPE_WORK_ORDER = ("float16", "bfloat16", "float32", "float64")     # heaviest first (jax ci, measured)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if _state(config) is None or config.getvalue("dist") != "load":
        return None     # not an attnconf run, or the user chose a distribution mode: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    from attnconf.reference import DTYPES

    suffix = re.compile(rf"-({'|'.join(map(re.escape, DTYPES))})\]$")
    order = {d: i for i, d in enumerate(DTYPE_WORK_ORDER)}

    class DtypeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            m = suffix.search(nodeid)
            return m.group(1) if m else "any"

        def _assign_work_unit(self, node: Any) -> None:
            first = min(self.workqueue, key=lambda scope: order.get(scope, len(order)))
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return DtypeScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.restore_gc()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = _state(metafunc.config)
    if state is None:
        return
    impls = state.session.impls
    cells = getattr(metafunc.function, "attnconf_dtypes", None)
    for fixture, kind in (("impl", "sdpa"), ("layer_impl", "layer")):
        if fixture not in metafunc.fixturenames:
            continue
        chosen = [a for a in impls if _kind(a) == kind]
        if cells is None or "dtype" not in metafunc.fixturenames:
            metafunc.parametrize(fixture, chosen, ids=[a.name for a in chosen], indirect=True)
            continue
        replay = state.session.replay
        pairs = [(a, d) for a in chosen for d in cells if d in getattr(a, "dtypes", ())
                 and (replay is None or getattr(replay, "dtype", d) == d)]
        metafunc.parametrize((fixture, "dtype"), pairs, ids=[f"{a.name}-{d}" for a, d in pairs],
                             indirect=[fixture])


def _subject(request: pytest.FixtureRequest) -> "harness.Subject":
    from attnconf.conformance.engine import harness

    state = _state(request.config)
    item = request.node
    adapter = request.param
    callspec = getattr(item, "callspec", None)
    dtype = callspec.params.get("dtype") if callspec is not None else None
    rec = harness.TestRecord(item.nodeid, getattr(item, "originalname", item.name), _clauses_of(item),
                             adapter.name, dtype=dtype)
    item.stash[RECORD_KEY] = rec
    return harness.Subject(adapter, rec, state.session)


@pytest.fixture
def impl(request: pytest.FixtureRequest) -> "harness.Subject":
    """The attention implementation under test, bound to this test's record."""
    return _subject(request)


@pytest.fixture
def layer_impl(request: pytest.FixtureRequest) -> "harness.Subject":
    """The multi-head attention layer under test, bound to this test's record."""
    return _subject(request)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _state(config) is None:
        if any(Path(str(item.path)).resolve().parent == SUITE_DIR for item in items):
            from attnconf import adapters

            _usage(f"--backend is required to run the attnconf suite; choose from: {', '.join(adapters.BACKENDS)} "
                   f"(installed here: {', '.join(adapters.available_backends())})")
        return
    from attnconf import spec

    items.sort(key=_rank)     # stable: the harness.first tests by rank, then the rest in collection order
    known = spec.clauses()
    for item in items:
        for mark in item.iter_markers("clauses"):
            unknown = [c for c in mark.args if c not in known]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid} cites unknown clause(s) {', '.join(unknown)}")


def _rank(item: pytest.Item) -> float:
    mark = item.get_closest_marker("attnconf_first")
    return float(mark.args[0]) if mark is not None else float("inf")


# ---- running ------------------------------------------------------------------------------------

def pytest_runtest_setup(item: pytest.Item) -> None:
    state = _state(item.config)
    if state is not None and _impl_of(item) != "-" and state.session.out_of_time():
        item.stash[RESULT_KEY] = {"status": "not_run"}
        pytest.skip(f"not run: the run's --run-timeout of {item.config.getoption('--run-timeout'):g} s is spent")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    from attnconf.conformance.engine import harness

    state = _state(item.config)
    if state is None:
        return (yield)
    item.stash[RESULT_KEY] = {"started": time.time()}
    try:
        result = yield
    except harness.NoResult:     # a test outside Hypothesis whose call gave no result ends there (recorded)
        result = None
    rec = item.stash.get(RECORD_KEY, None)
    if rec is not None and rec.examples and rec.unsupported == rec.examples and not rec.divergent:
        pytest.skip(f"unsupported: {'; '.join(sorted(rec.unsupported_reasons))}")
    if rec is not None and any(m.name == "attnconf_opt_in" for m in item.iter_markers()) and not rec.checked:
        item.stash[RESULT_KEY]["status"] = "not_requested"
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    state = _state(item.config)
    if state is None:
        return report
    from attnconf.conformance.engine import harness

    if call.when == "setup" and report.skipped and _impl_of(item) != "-":
        status = item.stash.get(RESULT_KEY, {}).get("status", "unsupported")
        report.user_properties.append(("attnconf", _record(item, None, status, _skip_reason(report))))
    if call.when != "call":
        return report
    rec = item.stash.get(RECORD_KEY, None)
    exc = _primary(call.excinfo.value) if call.excinfo is not None else None
    clause = None
    if report.passed:
        status = "divergent" if rec is not None and rec.divergent else "pass"
        message = None
    elif report.skipped:
        status = item.stash.get(RESULT_KEY, {}).get("status") or "unsupported"
        message = _skip_reason(report)
    elif isinstance(exc, harness.KernelAborted):
        status, message, clause = exc.status, exc.detail, "ATTN-OP-1"
    elif isinstance(exc, harness.ConformanceFailure):
        status, message, clause = "fail", str(exc).splitlines()[0], exc.clause
    else:
        status = "error"
        message = f"{type(exc).__name__}: {exc}".splitlines()[0] if exc is not None else "error"
    if status == "pass" and item.stash.get(RESULT_KEY, {}).get("status") == "not_requested":
        status = "not_requested"
    record = _record(item, rec, status, message)
    record["failed_clause"] = clause
    if status in FAILING and rec is not None:
        case = getattr(exc, "case", None) or rec.current_case
        if case is not None:
            record["case"] = case.summary()
            record["cause"], kept = _cause(state, rec, case, clause)
            if kept is not None:      # this cause and this clause have a saved case already: point at it
                record["failure_file"], record["replay"] = kept
                return _with_record(report, record, rec)
            try:
                path = _save_failure(item, case)
            except Exception as err:  # never lose the record because a case could not be saved
                report.sections.append(("attnconf replay", f"could not save the failing case: {err}"))
            else:
                record["failure_file"] = str(path)
                record["replay"] = _replay_command(item, path)
                state.keeper.keep(record["cause"], clause or "ATTN-OP-1", record["failure_file"], record["replay"])
                report.sections.append(("attnconf replay", f"saved case: {path}\nreplay: {record['replay']}"))
    return _with_record(report, record, rec)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "attnconf" and value["status"] == "divergent":
                return "divergent", "D", ("DIVERGENT(" + ",".join(value["divergences"]) + ")", {"yellow": True})
    return None


# ---- the end of the run ---------------------------------------------------------------------

def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    if state is None or getattr(config, "workerinput", None) is not None or config.option.collectonly:
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        state.interrupted = True
    run = run_file.build(state, final=True)
    state.run = run
    path = config.getoption("--report")
    if path:
        run_file.write(state, Path(path), run)
    v = run["verdict"]["verdict"]
    if v == "INCOMPLETE" and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.INTERRUPTED if session.exitstatus == 0 else session.exitstatus
    if v == "NONCONFORMANT" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if state is None or state.run is None:
        return
    write_summary(terminalreporter, state)
