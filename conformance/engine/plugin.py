"""The attnconf pytest plugin: options, the run's session, records, cells, verdict and run file.

All pytest plumbing lives here. A checkout loads it from the root conftest.py; an installed attnconf
loads it through its `pytest11` entry point (registered under the same name, so never twice). It is
inert unless `--backend` is given: installing attnconf never changes anybody else's test run, and
only collecting attnconf's own conformance tests without `--backend` is a usage error.

Flow: configure (validate options, load adapters and divergences, build the `Session` on
config.stash) -> parametrize tests over implementations and dtype cells -> each test's `impl`
fixture is a `harness.Subject` bound to the item's own `TestRecord` -> turn the outcome into a
record (pass / fail / error / unsupported / divergent / crashed / timeout / not_run) -> write the run
file as records arrive (so a stopped run keeps what it has, verdict INCOMPLETE) -> at the end,
cells, verdict and the final run file.
"""
from __future__ import annotations

import datetime as _dt
import gc
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import pytest

import attnconf
from attnconf.adapters.registry import REGISTRY

if TYPE_CHECKING:   # the rest is imported when a run starts: an inert plugin costs no NumPy import
    from attnconf.conformance.engine import harness

ROOT = Path(__file__).resolve().parents[2]
SUITE_DIR = Path(__file__).resolve().parents[1]
IN_CHECKOUT = (ROOT / ".git").exists() or (ROOT / "pyproject.toml").is_file()
SUITE_VERSION = attnconf.__version__
SESSION_KEY = pytest.StashKey["RunState"]()
RECORD_KEY = pytest.StashKey["harness.TestRecord"]()
RESULT_KEY = pytest.StashKey[dict]()
# The run file is rewritten as records arrive (a run killed outright keeps what it had; SIGINT and
# SIGTERM write it in full): at most every WRITE_EVERY_S, and never spending more than 1/WRITE_COST_SHARE
# of the run on it (each write validates the whole file, which grows with the run: 0.1-0.2 s for a
# jax ci run's 300 records, measured).
WRITE_EVERY_S = 5.0
WRITE_COST_SHARE = 50
GC_FULL_AFTER = 100
DEFAULT_RUN_TIMEOUT_S = 1800.0
FAILING = ("fail", "error", "crashed", "timeout")
PROFILES = ("dev", "ci", "thorough")


def register_profiles() -> None:
    """The Hypothesis profiles dev, ci (the certification profile) and thorough (idempotent)."""
    from hypothesis import HealthCheck, Phase, settings

    _HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
               HealthCheck.large_base_example, HealthCheck.differing_executors]
    settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=_HEALTH)
    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True,
                              suppress_health_check=_HEALTH, phases=[Phase.explicit, Phase.generate, Phase.shrink])
    settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=_HEALTH)


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
        self.keeper: Any = None                 # conformance.causes.Keeper: which failing cases are saved
        self.failed = 0

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
            _write_partial(self.config)

    def _stopping_failure(self) -> bool:
        """Whether this failure is the one that stops the run (-x, --maxfail): the final run file is written
        at once, so a partial write now would only validate the file twice (one validation of a -x run's file:
        0.57 s, measured under load)."""
        maxfail = getattr(self.config.option, "maxfail", 0) or 0
        return 0 < maxfail <= self.failed


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("attnconf", "attnconf conformance")
    g.addoption("--backend", help=f"backend under test: {', '.join(REGISTRY)} (required to run the suite)")
    g.addoption("--impl", default=None, help="comma-separated implementations of the backend (default: all on the device)")
    g.addoption("--device", default="cpu", help="cpu, cuda (torch) or gpu (jax, tensorflow)")
    g.addoption("--kernel", default=None, help="MODULE:ATTR: a third-party kernel in the backend's calling convention")
    g.addoption("--convention", default=None,
                help="how --kernel is called: sdpa (torch, numpy default), jax (jax default), flash_attn, "
                     "flash_attn_varlen, flash_attn_kvcache, flashinfer_prefill, flashinfer_decode")
    g.addoption("--capabilities", default=None,
                help="FILE.toml: the kernel's declared scope (as its attnconf_capabilities attribute would say)")
    g.addoption("--report", default=None, help="write the run's JSON record to PATH (updated as the run goes)")
    g.addoption("--failures-dir", default=None, help="where failing cases are saved as .npz (default: beside the report, else reports/failures)")
    g.addoption("--replay", default=None, help="run the given tests on one saved case (.npz) instead of generated ones")
    g.addoption("--allow-tf32", action="store_true", help="leave TF32 / reduced-precision matmuls on (shows what they cost)")
    g.addoption("--isolate", action="store_true", help="run the kernel in a worker process (crashes, hangs and memory are contained)")
    g.addoption("--case-timeout", type=float, default=60.0,
                help="seconds per kernel call, in the worker under --isolate and by SIGALRM otherwise (default 60)")
    g.addoption("--max-timeouts", type=int, default=2,
                help="after this many timed-out calls an implementation is not called again (default 2)")
    g.addoption("--run-timeout", type=float, default=DEFAULT_RUN_TIMEOUT_S,
                help=f"seconds after which no further test starts; the verdict is then INCOMPLETE "
                     f"(default {DEFAULT_RUN_TIMEOUT_S:g}; 0 = none)")
    g.addoption("--memory-limit", type=float, default=4.0, help="GiB of address space for the isolated worker (default 4)")
    g.addoption("--divergences-dir", default=None, help="folder of divergence files (default spec/divergences)")
    g.addoption("--long", action="store_true", help="also check long sequences against the tiled reference (ATTN-LONG-1)")
    g.addoption("--measure-memory", action="store_true", help="record peak memory against sequence length (ATTN-PROP-7)")


def _usage(msg: str) -> None:
    raise pytest.UsageError(msg)


def _state(config: pytest.Config) -> RunState | None:
    return config.stash.get(SESSION_KEY, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before Hypothesis' own plugin loads the profile named by --hypothesis-profile
    if config.getoption("--backend") or config.getoption("--hypothesis-profile", default=None) in PROFILES:
        register_profiles()
    config.addinivalue_line("markers", "clauses(*ids): spec clauses this test checks")
    config.addinivalue_line("markers", "attnconf_opt_in: an attnconf test that runs only when its option is given")
    config.addinivalue_line("markers", "attnconf_first(rank): an attnconf test that runs before the others")
    backend = config.getoption("--backend")
    if not backend:
        return  # inert: attnconf acts only when its options are given (see pytest_collection_modifyitems)
    from hypothesis import settings

    from attnconf import adapters, spec
    from attnconf.reference import Case

    from attnconf.conformance.engine import harness
    from attnconf.conformance.engine.divergences import DivergenceError, Divergences

    register_profiles()
    options = {"allow_tf32": config.getoption("--allow-tf32")}
    try:
        impls = adapters.load(backend, device=config.getoption("--device"), kernel=config.getoption("--kernel"),
                              impl=config.getoption("--impl"), options=options,
                              convention=config.getoption("--convention"),
                              capabilities=config.getoption("--capabilities"))
    except adapters.UsageError as exc:
        _usage(str(exc))
    if config.getoption("--isolate"):
        impls = _isolate(config, impls, options)
    from attnconf.conformance.engine.regions import load_all as load_regions
    from attnconf.conformance.engine.witnesses import load_all as load_witnesses

    load_regions()
    load_witnesses()
    try:
        folder = config.getoption("--divergences-dir")
        entries = spec.divergences(backend, Path(folder) if folder else None)
        from attnconf.conformance.engine.alternatives_contracts import contract_entries

        entries = entries + contract_entries(impls)     # a declared accuracy contract (SPEC section 29)
        divs = Divergences(entries, config.getoption("--device"))
        from attnconf.conformance.engine.declared import entries as declared_entries

        divs.entries += [e for a in impls for e in declared_entries(a)]     # the kernels' documented behaviour
    except (spec.SpecError, DivergenceError, ValueError) as exc:
        _usage(f"malformed divergence file: {exc}")
    report = config.getoption("--report")
    if report:
        _check_writable(Path(report))
    replay = None
    if config.getoption("--replay"):
        try:
            replay = Case.load(config.getoption("--replay"))
        except Exception as exc:
            _usage(f"--replay {config.getoption('--replay')}: cannot load the case: {type(exc).__name__}: {exc}")
    seed = config.getoption("--hypothesis-seed", default=None)
    run_timeout = config.getoption("--run-timeout")
    session = harness.Session(
        backend=backend, impls=impls, divergences=divs, device=config.getoption("--device"), replay=replay,
        long=config.getoption("--long"), measure_memory=config.getoption("--measure-memory"),
        seed=int(seed) if seed not in (None, "") else None, case_timeout=config.getoption("--case-timeout"),
        max_timeouts=config.getoption("--max-timeouts"),
        deadline=time.time() + run_timeout if run_timeout and run_timeout > 0 else None,
        entries=divs.entries, options=options)
    state = RunState(session, config)
    config.stash[SESSION_KEY] = state
    if _by_cli(config):     # pytest's own lines name tests from the caller's folder: ../../site-packages/...
        config.cwd_relative_nodeid = lambda nodeid: nodeid
    settings.load_profile(config.getoption("--hypothesis-profile", default=None) or "dev")
    if getattr(config, "workerinput", None) is None:
        config.pluginmanager.register(state, "attnconf-run")
        _install_sigterm(config)
        if report and not config.getoption("--failures-dir") and replay is None:   # a replay keeps its case
            _clear_saved_failures(_failures_dir(config))


def _clear_saved_failures(folder: Path) -> None:
    """The cases saved beside a run file belong to that run file: a new run that replaces it removes them,
    so that every .npz left there is one the new run file names."""
    for old in folder.glob("*.npz") if folder.is_dir() else ():
        old.unlink(missing_ok=True)


def _install_sigterm(config: pytest.Config) -> None:
    """SIGTERM stops the run like Ctrl-C: pytest finishes the session and the run file is written."""
    def stop(signum, frame):
        state = _state(config)
        if state is not None:
            state.interrupted = True
            _write_partial(config, force=True)
        raise KeyboardInterrupt("SIGTERM")

    try:
        signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        pass


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f".attnconf-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        _usage(f"--report {path}: cannot write there: {exc.strerror or exc}")
    if path.is_dir():
        _usage(f"--report {path}: is a directory; give a file path")


def _isolate(config: pytest.Config, impls: list, options: dict) -> list:
    from attnconf import adapters  # noqa: F401  (the package is loaded by then)
    from attnconf.adapters.isolated import IsolatedAdapter

    out = []
    for a in impls:
        spec_ = {"backend": config.getoption("--backend"), "device": config.getoption("--device"),
                 "kernel": config.getoption("--kernel"), "impl": None if config.getoption("--kernel") else a.name,
                 "convention": config.getoption("--convention"), "capabilities": config.getoption("--capabilities"),
                 "options": options}
        out.append(IsolatedAdapter(spec_, a.name, timeout_s=config.getoption("--case-timeout"),
                                   memory_bytes=int(config.getoption("--memory-limit") * 2**30)))
    return out


# ---- collection and parametrization ------------------------------------------------------------

def _kind(adapter) -> str:
    return "layer" if getattr(adapter, "kind", "sdpa") == "layer" else "sdpa"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Lighter garbage collection for the run (only when attnconf runs): a run's heap grows with every
    shape a compile-per-shape framework compiles (a jax ci run: 2.4 GB, 1260 XLA executables) and
    each full collection rescans all of it (20 of them, 3.8 s of a 97 s jax run, measured). What is
    alive once collection ends is frozen, and a full collection waits for GC_FULL_AFTER younger ones
    instead of 10 (2.3 s of collection in that run); `pytest_unconfigure` restores both. A process that
    froze objects itself keeps its own freezing."""
    state = _state(session.config)
    if state is None or state.gc_restore is not None:
        return
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    t0, t1, t2 = gc.get_threshold()
    state.gc_restore = ((t0, t1, t2), froze)
    gc.set_threshold(t0, t1, GC_FULL_AFTER)


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
    if state is not None and state.gc_restore is not None:
        thresholds, froze = state.gc_restore
        gc.set_threshold(*thresholds)
        if froze:
            gc.unfreeze()
        state.gc_restore = None


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


def _impl_of(item: pytest.Item) -> str:
    rec = item.stash.get(RECORD_KEY, None)
    if rec is not None:
        return rec.implementation
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        from attnconf.adapters.base import Implementation

        for name in ("impl", "layer_impl"):
            if name in callspec.params and isinstance(callspec.params[name], Implementation):
                return callspec.params[name].name
    return "-"


def _dtype_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("dtype") if callspec is not None else None


def _clauses_of(item: pytest.Item) -> list[str]:
    out: list[str] = []
    for mark in item.iter_markers("clauses"):
        out.extend(c for c in mark.args if c not in out)
    return out


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


def _with_record(report: pytest.TestReport, record: dict[str, Any], rec) -> pytest.TestReport:
    """Attach the record; the kernel outputs the test item kept for diagnosing are no longer needed."""
    if rec is not None:
        rec.outputs.clear()
    report.user_properties.append(("attnconf", record))
    return report


def _cause(state: RunState, rec: "harness.TestRecord", case, clause: str | None) -> tuple[str, tuple | None]:
    """The failure's cause (conformance/engine/causes.py) and, if its cause and clause have a saved case, that case."""
    from attnconf.conformance.engine import causes

    if state.keeper is None:
        state.keeper = causes.Keeper()
    try:
        cause = causes.diagnose(case, rec.output_of(case), clause, others=rec.outputs)
    except Exception:   # noqa: BLE001 (a diagnosis must never lose the record)
        cause = f"{causes.UNEXPLAINED}:{clause or 'ATTN-OP-1'}"
    return cause, state.keeper.existing(cause, clause or "ATTN-OP-1")


def _primary(exc: BaseException) -> BaseException:
    """The first conformance failure inside an exception group (Hypothesis reports several so)."""
    from attnconf.conformance.engine import harness

    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            inner = _primary(sub)
            if isinstance(inner, (harness.ConformanceFailure, harness.KernelAborted)):
                return inner
        return _primary(exc.exceptions[0])
    return exc


def _skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    return str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


def _record(item: pytest.Item, rec: "harness.TestRecord | None", status: str, message: str | None) -> dict[str, Any]:
    started = item.stash.get(RESULT_KEY, {}).get("started")
    return {
        "nodeid": item.nodeid, "test": getattr(item, "originalname", item.name), "clauses": _clauses_of(item),
        "implementation": _impl_of(item), "dtype": _dtype_of(item), "status": status,
        "divergences": sorted(rec.divergences) if rec else [],
        "examples": rec.examples if rec else 0,
        "examples_checked": rec.checked if rec else 0,
        "examples_unsupported": rec.unsupported if rec else 0,
        "examples_divergent": rec.divergent if rec else 0,
        "divergent_by_entry": dict(rec.divergent_by_entry) if rec else {},
        "conformed_in_region": dict(rec.conformed_in_region) if rec else {},
        "checked_features": dict(rec.checked_features) if rec else {},
        "unsupported_reasons": sorted(rec.unsupported_reasons)[:10] if rec else ([message] if message else []),
        "ratios": rec.ratios if rec else {}, "samples": rec.samples if rec else [],
        "observations": rec.observations if rec else [], "panel": rec.panel if rec else [],
        "message": message, "case": None, "replay": None, "failure_file": None, "failed_clause": None,
        "duration_s": round(time.time() - started, 3) if started else 0.0,
    }


def _failures_dir(config: pytest.Config) -> Path:
    explicit = config.getoption("--failures-dir")
    if explicit:
        return Path(explicit)
    report = config.getoption("--report")
    if report:
        return Path(report).with_suffix("").parent / (Path(report).stem + "-failures")
    # never inside site-packages: an installed attnconf saves failing cases where it was run
    return ROOT / "reports" / "failures" if IN_CHECKOUT else Path.cwd() / "attnconf-failures"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def _save_failure(item: pytest.Item, case) -> Path:
    path = _failures_dir(item.config) / f"{_slug(item.name)}-{case.digest()}.npz"
    return case.save(path)


SUITE_INI = "pytest-attnconf.ini"     # the configuration `attnconf certify` and `attnconf replay` run the suite with


def _by_cli(config: pytest.Config) -> bool:
    """Whether `attnconf certify` / `replay` started this run (their -c ini, the suite folder as rootdir)."""
    return config.inipath is not None and config.inipath.name == SUITE_INI


def _replay_command(item: pytest.Item, path: Path) -> str:
    """The command that replays `path`: pytest from a checkout, `attnconf replay` from an installed suite or a
    run that `attnconf certify` started (its node ids are relative to the suite folder, not to the caller)."""
    cfg = item.config
    if IN_CHECKOUT and not _by_cli(cfg):
        parts = [sys.executable, "-m", "pytest", item.nodeid, f"--backend={cfg.getoption('--backend')}",
                 f"--device={cfg.getoption('--device')}"]
    else:
        parts = [*((sys.executable, "-m", "attnconf") if IN_CHECKOUT else ("attnconf",)), "replay", str(path), "--backend", cfg.getoption("--backend"), "--test", item.nodeid,
                 "--device", cfg.getoption("--device")]
        if cfg.getoption("--kernel"):
            parts += ["--kernel", cfg.getoption("--kernel")]
            for opt in ("--convention", "--capabilities"):
                if cfg.getoption(opt):
                    parts += [opt, str(Path(cfg.getoption(opt)).resolve()) if opt == "--capabilities"
                              else cfg.getoption(opt)]
        else:
            parts += ["--impl", _impl_of(item)]
        if cfg.getoption("--divergences-dir"):
            parts += ["--divergences-dir", str(Path(cfg.getoption("--divergences-dir")).resolve())]
        if cfg.getoption("--isolate"):
            parts.append("--isolate")
        return " ".join(shlex.quote(p) for p in parts)
    if cfg.getoption("--kernel"):
        parts.append(f"--kernel={cfg.getoption('--kernel')}")
        for opt in ("--convention", "--capabilities"):
            if cfg.getoption(opt):
                parts.append(f"{opt}={cfg.getoption(opt)}")
    else:
        parts.append(f"--impl={_impl_of(item)}")
    if cfg.getoption("--allow-tf32"):
        parts.append("--allow-tf32")
    if cfg.getoption("--isolate"):
        parts.append("--isolate")
    if cfg.getoption("--divergences-dir"):
        parts.append(f"--divergences-dir={cfg.getoption('--divergences-dir')}")
    parts.append(f"--replay={path}")
    return " ".join(shlex.quote(p) for p in parts)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "attnconf" and value["status"] == "divergent":
                return "divergent", "D", ("DIVERGENT(" + ",".join(value["divergences"]) + ")", {"yellow": True})
    return None


# ---- the end of the run: cells, verdict and report ---------------------------------------------

def _git_revision() -> str | None:
    if not (ROOT / ".git").exists():      # an installed attnconf: its version says which suite ran
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _environment(config: pytest.Config, state: RunState) -> dict[str, Any]:
    import numpy as np
    from hypothesis import settings

    from attnconf import spec

    described = {}
    for a in state.session.impls:
        try:
            described[a.name] = a.describe()
        except Exception as exc:  # describe() of a broken kernel must not lose the run
            described[a.name] = {"error": f"{type(exc).__name__}: {exc}"}
    frameworks = {"numpy": np.__version__}
    for d in described.values():
        if isinstance(d, dict) and d.get("framework") and d.get("version"):
            frameworks[d["framework"]] = d["version"]
    first = next(iter(described.values()), {})
    prof = settings.default
    from attnconf.conformance.engine.divergences import cpu_flags

    return {
        "suite_version": SUITE_VERSION, "git_revision": _git_revision(),
        "spec_hash": spec.spec_hash(), "backend": state.session.backend, "device": config.getoption("--device"),
        "device_name": first.get("device_name") or platform.processor() or platform.machine(),
        "compute_capability": first.get("compute_capability"),
        "frameworks": frameworks, "python": platform.python_version(), "platform": platform.platform(),
        "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "sse4", "fma", "f16c"))),
        "precision_flags": {"allow_tf32": bool(state.session.options["allow_tf32"]),
                            **{k: v for d in described.values() if isinstance(d, dict)
                               for k, v in (d.get("precision_flags") or {}).items()}},
        "hypothesis": {"profile": config.getoption("--hypothesis-profile", default=None) or "dev",
                       "seed": config.getoption("--hypothesis-seed", default=None),
                       "max_examples": prof.max_examples, "derandomize": prof.derandomize},
        "kernel": config.getoption("--kernel"), "convention": config.getoption("--convention"),
        "isolated": bool(config.getoption("--isolate")),
        "run_timeout_s": config.getoption("--run-timeout"), "case_timeout_s": config.getoption("--case-timeout"),
        "implementations": described,
        "scopes": {a.name: _scope(a) for a in state.session.impls},
    }


def _scope(adapter) -> dict[str, Any]:
    """The implementation's declared scope for the run file and the certificate (adapters/scope.py's words)."""
    declared = dict(adapter.scope() if callable(getattr(adapter, "scope", None)) else {})
    caps = set(getattr(adapter, "capabilities", ()))
    out = {"kind": _kind(adapter), "dtypes": list(getattr(adapter, "dtypes", ())), "grads": "grads" in caps,
           "dropout": "dropout" in caps, "features": sorted(caps - {"grads", "dropout"}),
           "max_head_dim": getattr(adapter, "max_head_dim", None)}
    out.update(declared)
    out.update(declared.get("limits") or {})
    return out


def _run_file(config: pytest.Config, *, final: bool) -> dict[str, Any]:
    from attnconf import spec

    from attnconf.conformance.engine.causes import group as group_causes
    from attnconf.conformance.engine.verdict import build_cells, decide, plan

    state = _state(config)
    session = state.session
    records = [dict(r) for r in state.records]
    observations = [o for r in records for o in r.pop("observations", [])]
    panel: dict[str, list] = {}
    for r in records:
        for entry in r.pop("panel", []):
            panel.setdefault(r["implementation"], []).append(entry)
    witnessed: dict[str, dict[str, Any]] = {}
    for o in observations:
        if o["clause"] == "WITNESS":
            witnessed[o["key"]] = o["value"]
    observations = [o for o in observations if o["clause"] not in ("WITNESS",)]
    seen = {d for r in records for d in r["divergences"]}
    entries = {e["id"]: e for e in session.entries}
    from attnconf.conformance.engine.declared import examples as declared_examples
    floor = spec.coverage()["min_examples"]
    impls = {a.name: {"kind": _kind(a), "dtypes": list(getattr(a, "dtypes", ())),
                      "features": sorted(getattr(a, "capabilities", ()))} for a in session.impls}
    if state.plan is None:
        state.plan = plan()
    cells = build_cells(records, impls, state.plan, entries)
    stale = sorted(eid for eid, w in witnessed.items()
                   if isinstance(w, dict) and str(w.get("status", "")).startswith("stale"))
    complete = final and not state.interrupted and not session.out_of_time()
    v = decide(cells, records, floor=floor, complete=complete, apply_floor=session.replay is None, stale=stale)
    if not final:
        v["verdict"] = "INCOMPLETE"
        v["incomplete_reasons"] = ["the run is still going (or was stopped before its end)"]
    divs = []
    for e in session.entries:
        w = witnessed.get(e["id"])
        divs.append({"id": e["id"], "clause": e["clause"], "kind": e["kind"], "region": e["region"],
                     "instead": e["instead"], "quantities": e["quantities"], "dtypes": e["dtypes"],
                     "bound": e.get("bound"), "value": e.get("value"), "when": e["when"],
                     "holds": e["holds"], "condition": e["condition"], "reason": e["reason"],
                     "measured": e.get("measured", ""), "link": e.get("link") or None,
                     "implementations": e["implementations"], "observed": e["id"] in seen,
                     "witness": e["witness"],
                     **({"declared": e["declared"], "examples": declared_examples(records, e["id"]),
                         "contradicted": any(f"] {e['id']}: " in str(r.get("message") or "") for r in records)} if e.get("declared") else {}),
                     "witness_status": (w or {}).get("status", "not run") if isinstance(w, dict) else str(w or "not run"),
                     "witness_detail": (w or {}).get("detail", "") if isinstance(w, dict) else ""})
    stamp = _dt.datetime.now(_dt.timezone.utc)
    if state.environment is None:
        state.environment = _environment(config, state)
    env = state.environment
    return {
        "schema_version": 2,
        "run_id": f"{session.backend}-{env['device']}-{dt_stamp(state.started)}-{os.getpid():x}",
        "created": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "complete": complete,
        "duration_s": round(time.time() - state.started, 1),
        "environment": env, "records": records, "observations": observations, "panel": panel,
        "cells": [c.as_dict(floor) for c in sorted(cells.values(), key=lambda c: (c.implementation, c.clause, c.dtype))],
        "divergences": divs, "verdict": v, "causes": group_causes(records),
    }


def dt_stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y%m%dT%H%M%S")


def _write_partial(config: pytest.Config, *, force: bool = False) -> None:
    state = _state(config)
    path = config.getoption("--report")
    if state is None or not path or state.run is not None:
        return
    now = time.time()
    if not force and now - state.last_write < max(WRITE_EVERY_S, WRITE_COST_SHARE * state.write_cost):
        return
    state.last_write = now
    try:
        _write_run(Path(path), _run_file(config, final=False))
    except Exception as exc:  # a partial write must never stop the run
        sys.stderr.write(f"attnconf: could not update {path}: {type(exc).__name__}: {exc}\n")
    state.write_cost = time.time() - now


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    if state is None or getattr(config, "workerinput", None) is not None or config.option.collectonly:
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        state.interrupted = True
    run = _run_file(config, final=True)
    state.run = run
    path = config.getoption("--report")
    if path:
        _write_run(Path(path), run)
    v = run["verdict"]["verdict"]
    if v == "INCOMPLETE" and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.INTERRUPTED if session.exitstatus == 0 else session.exitstatus
    if v == "NONCONFORMANT" and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def ratio_tail(records: list[dict[str, Any]], name: str) -> str:
    """'; worst error ratio float32 0.412, float16 inf' for one implementation: NaN and inf (non-finite output
    where the reference is finite) count as the worst, and 3 significant digits never print a 1.75e6 as 0.00."""
    from attnconf.conformance.engine.harness import worst

    out: dict[str, float] = {}
    for r in records:
        if r["implementation"] == name:
            for dt, v in (r.get("ratios") or {}).items():
                out[dt] = worst(out.get(dt, 0.0), float(v["max"]))
    if not out:
        return ""
    return "; worst error ratio " + ", ".join(f"{d} {v:.3g}" for d, v in sorted(out.items()))


_UNVALIDATED_SAID: list[Path] = []   # the run file that was written unvalidated, said once per process


def _write_run(path: Path, run: dict[str, Any]) -> None:
    """Write the run file; if it does not validate (a suite bug), keep the records anyway beside it."""
    import json

    from attnconf.reports import runfile

    try:
        runfile.write(path, run)
    except runfile.SchemaUnavailable as exc:
        # a run on a machine without jsonschema (a GPU image, say) keeps its results, unvalidated
        runfile.write(path, run, check=False)
        if not _UNVALIDATED_SAID:
            _UNVALIDATED_SAID.append(path)
            sys.stderr.write(f"attnconf: {exc}; it is written unvalidated\n")
    except runfile.RunFileError as exc:
        keep = path.with_suffix(".invalid.json")
        keep.write_text(json.dumps(runfile.encode(run), indent=1) + "\n")
        raise runfile.RunFileError(f"{exc}; the records are kept in {keep}") from None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from attnconf.conformance.engine.verdict import verdict_line

    state = _state(config)
    if state is None or state.run is None:
        return
    run = state.run
    tr = terminalreporter
    tr.section("attnconf")
    counts: dict[str, int] = {}
    for r in run["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    tr.write_line(f"backend {state.session.backend} on {run['environment']['device']}: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    cells: dict[str, dict[str, int]] = {}
    for c in run["cells"]:
        cells.setdefault(c["implementation"], {}).setdefault(c["status"], 0)
        cells[c["implementation"]][c["status"]] += 1
    for name in sorted(cells):
        tail = ratio_tail(run["records"], name)
        tr.write_line(f"  {name}: clause x dtype cells " + ", ".join(f"{n} {s}" for s, n in sorted(cells[name].items()))
                      + tail)
    v = run["verdict"]
    from attnconf.reports.causes import cause_line

    for g in run.get("causes") or []:
        tr.write_line(f"  CAUSE {cause_line(g)}", red=g.get("declaration") is None, yellow=g.get("declaration") is not None)
        if g.get("replay"):
            tr.write_line(f"    replay: {g['replay']}")
    for f in v.get("failures", []):
        tr.write_line(f"  FAILED {f['clause']} ({f['implementation']}, {f['dtype']}): {f.get('message')}")
        if f.get("case"):
            tr.write_line(f"    case: {f['case']}")
        if f.get("replay"):
            tr.write_line(f"    replay: {f['replay']}")
    for r in run["records"]:
        if r["status"] in FAILING and r.get("failed_clause") is None:
            tr.write_line(f"  {r['status'].upper()} {r['nodeid']}: {r['message']}")
    for d in run["divergences"]:
        if d.get("declared"):
            from attnconf.conformance.engine.declared import sentence

            tr.write_line(f"  declared {sentence(d)}", red=bool(d.get("contradicted")))
            continue
        if not d["holds"]:
            tr.write_line(f"  divergence {d['id']} inactive here ({d['condition']}); witness: {d['witness_status']}")
        elif str(d["witness_status"]).startswith("stale"):
            tr.write_line(f"  STALE divergence {d['id']}: its witness conforms now ({d['witness_detail']}); "
                          f"remove or narrow the entry", yellow=True)
    missing = v.get("missing") or []
    if missing and v["verdict"] == "INCOMPLETE":
        shown = ", ".join(f"{m['implementation']} {m['clause']} {m['dtype']} ({m['status']}, {m['checked']})"
                          for m in missing[:12])
        tr.write_line(f"  cells missing the floor of {v['floor']} example(s): {shown}"
                      + (f" and {len(missing) - 12} more" if len(missing) > 12 else ""))
    tr.write_line(f"verdict: {verdict_line(v)}", bold=True)
    if config.getoption("--report"):
        tr.write_line(f"report: {config.getoption('--report')}")
