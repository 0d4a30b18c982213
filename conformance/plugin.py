"""The attnconf pytest plugin: options, implementations, records, verdict and report.

All pytest plumbing lives here. `conformance/conftest.py` only re-exports it.
Flow: configure (validate options, load adapters and divergences) ->
parametrize tests over implementations -> open a TestRecord around each test
-> turn its outcome into a record (pass / fail / error / unsupported /
divergent / crashed / timeout) -> at the end compute the verdict and write the
run file.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from attnconf import adapters
from attnconf import spec
from attnconf.reference import Case

from . import harness
from .divergences import Divergences

ROOT = Path(__file__).resolve().parent.parent
SUITE_DIR = Path(__file__).resolve().parent
SUITE_VERSION = "0.1.0"
FAILING = ("fail", "error", "crashed", "timeout")
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example, HealthCheck.differing_executors]

settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=_HEALTH, phases=[Phase.explicit, Phase.generate, Phase.shrink])
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=_HEALTH)
RECORD_KEY = pytest.StashKey[dict]()



def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("attnconf", "attnconf conformance")
    g.addoption("--backend", help=f"backend under test: {', '.join(adapters.BACKENDS)} (required)")
    g.addoption("--impl", default=None, help="comma-separated implementations of the backend (default: all on the device)")
    g.addoption("--device", default="cpu", help="cpu, cuda (torch) or gpu (jax, tensorflow)")
    g.addoption("--kernel", default=None, help="MODULE:ATTR: a third-party kernel in the backend's calling convention")
    g.addoption("--convention", default=None,
                help="how --kernel is called: sdpa (torch, numpy default), jax (jax default), flash_attn, "
                     "flash_attn_varlen, flash_attn_kvcache, flashinfer_prefill, flashinfer_decode")
    g.addoption("--capabilities", default=None,
                help="FILE.toml: the kernel's declared scope (as its attnconf_capabilities attribute would say)")
    g.addoption("--report", default=None, help="write the run's JSON record to PATH")
    g.addoption("--failures-dir", default=None, help="where failing cases are saved as .npz (default: beside the report, else reports/failures)")
    g.addoption("--replay", default=None, help="run the given tests on one saved case (.npz) instead of generated ones")
    g.addoption("--allow-tf32", action="store_true", help="leave TF32 / reduced-precision matmuls on (shows what they cost)")
    g.addoption("--isolate", action="store_true", help="run the kernel in a worker process (crashes, hangs and memory are contained)")
    g.addoption("--case-timeout", type=float, default=60.0, help="seconds per kernel call under --isolate (default 60)")
    g.addoption("--memory-limit", type=float, default=4.0, help="GiB of address space for the isolated worker (default 4)")
    g.addoption("--divergences-dir", default=None, help="folder of divergence files (default spec/divergences)")
    g.addoption("--long", action="store_true", help="also check long sequences against the tiled reference (ATTN-LONG-1)")
    g.addoption("--measure-memory", action="store_true", help="record peak memory against sequence length (ATTN-PROP-7)")


def _usage(msg: str) -> None:
    raise pytest.UsageError(msg)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clauses(*ids): spec clauses this test checks")
    backend = config.getoption("--backend")
    if not backend:
        return  # inert: attnconf acts only when its options are given (see pytest_collection_modifyitems)
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
    try:
        entries = spec.divergences(backend, Path(config.getoption("--divergences-dir")) if config.getoption("--divergences-dir") else None)
        divs = Divergences(entries, config.getoption("--device"))
    except (spec.SpecError, ValueError) as exc:
        _usage(f"malformed divergence file: {exc}")
    report = config.getoption("--report")
    if report:
        _check_writable(Path(report))
    replay = config.getoption("--replay")
    if replay:
        try:
            harness.SESSION.replay = Case.load(replay)
        except Exception as exc:
            _usage(f"--replay {replay}: cannot load the case: {type(exc).__name__}: {exc}")
    harness.SESSION.divergences = divs
    harness.SESSION.device = config.getoption("--device")
    harness.SESSION.long = config.getoption("--long")
    harness.SESSION.measure_memory = config.getoption("--measure-memory")
    seed = config.getoption("--hypothesis-seed", default=None)
    harness.SESSION.seed = int(seed) if seed not in (None, "") else None
    config.stash[RECORD_KEY] = {"impls": impls, "records": [], "started": time.time(), "backend": backend,
                                "options": options, "entries": entries}
    settings.load_profile(config.getoption("--hypothesis-profile", default=None) or "dev")


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
    from attnconf.adapters.isolated import IsolatedAdapter

    out = []
    for a in impls:
        spec_ = {"backend": config.getoption("--backend"), "device": config.getoption("--device"),
                 "kernel": config.getoption("--kernel"), "impl": None if config.getoption("--kernel") else a.name,
                 "options": options}
        out.append(IsolatedAdapter(spec_, a.name, timeout_s=config.getoption("--case-timeout"),
                                   memory_bytes=int(config.getoption("--memory-limit") * 2**30)))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash.get(RECORD_KEY, None)
    if state is None:
        return
    for fixture, kind in (("impl", "sdpa"), ("layer_impl", "layer")):
        if fixture in metafunc.fixturenames:
            chosen = [a for a in state["impls"] if getattr(a, "kind", "sdpa") == kind]
            metafunc.parametrize(fixture, chosen, ids=[a.name for a in chosen], scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if RECORD_KEY not in config.stash:
        if any(Path(str(item.path)).resolve().parent == SUITE_DIR for item in items):
            _usage(f"--backend is required to run the attnconf suite; choose from: {', '.join(adapters.BACKENDS)} "
                   f"(installed here: {', '.join(adapters.available_backends())})")
        return
    known = spec.clauses()
    for item in items:
        for mark in item.iter_markers("clauses"):
            unknown = [c for c in mark.args if c not in known]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid} cites unknown clause(s) {', '.join(unknown)}")


def _impl_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for name in ("impl", "layer_impl"):
            if name in callspec.params and isinstance(callspec.params[name], adapters.Adapter):
                return callspec.params[name].name
    return "-"


def _clauses_of(item: pytest.Item) -> list[str]:
    out: list[str] = []
    for mark in item.iter_markers("clauses"):
        out.extend(c for c in mark.args if c not in out)
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if RECORD_KEY not in item.config.stash:
        return (yield)
    harness.begin(harness.TestRecord(item.nodeid, item.originalname if hasattr(item, "originalname") else item.name,
                                     _clauses_of(item), _impl_of(item)))
    item._attnconf_started = time.time()
    result = yield
    rec = harness._CURRENT
    if rec is not None and rec.examples and rec.unsupported == rec.examples and not rec.divergent:
        pytest.skip(f"unsupported: {'; '.join(sorted(rec.unsupported_reasons))}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if RECORD_KEY not in item.config.stash:
        return report
    if call.when == "setup" and report.skipped and _impl_of(item) != "-":
        # (a test with no implementation of its kind, e.g. no layer adapter, leaves no record)
        report.user_properties.append(("attnconf", _record(item, None, "unsupported", _skip_reason(report))))
    if call.when != "call":
        return report
    rec = harness.end()
    exc = _primary(call.excinfo.value) if call.excinfo is not None else None
    if report.passed:
        status = "divergent" if rec is not None and rec.divergent else "pass"
        message = None
    elif report.skipped:
        status, message = "unsupported", _skip_reason(report)
    elif isinstance(exc, harness.KernelAborted):
        status, message = exc.status, exc.detail
    elif isinstance(exc, harness.ConformanceFailure):
        status, message = "fail", str(exc).splitlines()[0]
    else:
        status, message = "error", f"{type(exc).__name__}: {exc}".splitlines()[0] if exc is not None else "error"
    record = _record(item, rec, status, message)
    if status in FAILING and rec is not None:
        case = getattr(exc, "case", None) or rec.current_case
        if case is not None:
            record["case"] = case.summary()
            try:
                path = _save_failure(item, case)
            except Exception as exc:  # never lose the record because a case could not be saved
                report.sections.append(("attnconf replay", f"could not save the failing case: {exc}"))
            else:
                record["failure_file"] = str(path)
                record["replay"] = _replay_command(item, path)
                report.sections.append(("attnconf replay", f"saved case: {path}\nreplay: {record['replay']}"))
    report.user_properties.append(("attnconf", record))
    return report


def _primary(exc: BaseException) -> BaseException:
    """The first conformance failure inside an exception group (Hypothesis reports several so)."""
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


def _record(item: pytest.Item, rec: harness.TestRecord | None, status: str, message: str | None) -> dict[str, Any]:
    started = getattr(item, "_attnconf_started", None)
    return {
        "nodeid": item.nodeid, "test": getattr(item, "originalname", item.name), "clauses": _clauses_of(item),
        "implementation": _impl_of(item), "status": status,
        "divergences": sorted(rec.divergences) if rec else [],
        "examples": rec.examples if rec else 0,
        "examples_unsupported": rec.unsupported if rec else 0,
        "examples_divergent": rec.divergent if rec else 0,
        "unsupported_reasons": sorted(rec.unsupported_reasons)[:10] if rec else ([message] if message else []),
        "ratios": rec.ratios if rec else {}, "samples": rec.samples if rec else [],
        "observations": rec.observations if rec else [], "panel": rec.panel if rec else [],
        "message": message, "case": None, "replay": None, "failure_file": None,
        "duration_s": round(time.time() - started, 3) if started else 0.0,
    }


def _failures_dir(config: pytest.Config) -> Path:
    explicit = config.getoption("--failures-dir")
    if explicit:
        return Path(explicit)
    report = config.getoption("--report")
    return Path(report).with_suffix("").parent / (Path(report).stem + "-failures") if report else ROOT / "reports" / "failures"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def _save_failure(item: pytest.Item, case: Case) -> Path:
    path = _failures_dir(item.config) / f"{_slug(item.name)}-{case.digest()}.npz"
    return case.save(path)


def _replay_command(item: pytest.Item, path: Path) -> str:
    cfg = item.config
    parts = [sys.executable, "-m", "pytest", item.nodeid, f"--backend={cfg.getoption('--backend')}",
             f"--device={cfg.getoption('--device')}"]
    if cfg.getoption("--kernel"):
        parts.append(f"--kernel={cfg.getoption('--kernel')}")
    else:
        parts.append(f"--impl={_impl_of(item)}")
    if cfg.getoption("--allow-tf32"):
        parts.append("--allow-tf32")
    if cfg.getoption("--isolate"):
        parts.append("--isolate")
    parts.append(f"--replay={path}")
    return " ".join(shlex.quote(p) for p in parts)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect records on the controller (works with and without pytest-xdist)."""
    cfg = _CONFIG
    if cfg is None or RECORD_KEY not in cfg.stash:
        return
    for key, value in report.user_properties:
        if key == "attnconf":
            cfg.stash[RECORD_KEY]["records"].append(value)


_CONFIG: pytest.Config | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _CONFIG
    _CONFIG = session.config


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "attnconf" and value["status"] == "divergent":
                return "divergent", "D", ("DIVERGENT(" + ",".join(value["divergences"]) + ")", {"yellow": True})
    return None


# ---- the end of the run: verdict and report -----------------------------

def verdict(records: list[dict[str, Any]]) -> dict[str, Any]:
    failed = sorted({c for r in records if r["status"] in FAILING for c in r["clauses"]})
    divs = sorted({d for r in records for d in r["divergences"]})
    if any(r["status"] in FAILING for r in records):
        v = "NONCONFORMANT"
    elif divs:
        v = "CONFORMANT_WITH_DIVERGENCES"
    else:
        v = "CONFORMANT"
    return {"verdict": v, "divergences": divs, "failed_clauses": failed}


def verdict_line(v: dict[str, Any]) -> str:
    if v["verdict"] == "CONFORMANT_WITH_DIVERGENCES":
        return f"CONFORMANT_WITH_DIVERGENCES[{', '.join(v['divergences'])}]"
    if v["verdict"] == "NONCONFORMANT":
        return f"NONCONFORMANT (failed clauses: {', '.join(v['failed_clauses']) or 'none cited'})"
    return "CONFORMANT"


def coverage(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    cov = {cid: {"passed": 0, "run": 0, "total": 0} for cid in spec.clauses()}
    for r in records:
        for c in r["clauses"]:
            if c not in cov:
                continue
            cov[c]["total"] += 1
            if r["status"] != "unsupported":
                cov[c]["run"] += 1
            if r["status"] in ("pass", "divergent"):
                cov[c]["passed"] += 1
    return cov


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _environment(config: pytest.Config, state: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    described = {}
    for a in state["impls"]:
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
    return {
        "suite_version": SUITE_VERSION, "git_revision": _git_revision(), "spec_hash": spec.spec_hash(),
        "backend": state["backend"], "device": config.getoption("--device"),
        "device_name": first.get("device_name") or platform.processor() or platform.machine(),
        "compute_capability": first.get("compute_capability"),
        "frameworks": frameworks, "python": platform.python_version(), "platform": platform.platform(),
        "precision_flags": {"allow_tf32": bool(state["options"]["allow_tf32"]),
                            **{k: v for d in described.values() if isinstance(d, dict)
                               for k, v in (d.get("precision_flags") or {}).items()}},
        "hypothesis": {"profile": config.getoption("--hypothesis-profile", default=None) or "dev",
                       "seed": config.getoption("--hypothesis-seed", default=None),
                       "max_examples": prof.max_examples, "derandomize": prof.derandomize},
        "kernel": config.getoption("--kernel"), "isolated": bool(config.getoption("--isolate")),
        "implementations": described,
    }


def _run_file(config: pytest.Config) -> dict[str, Any]:
    state = config.stash[RECORD_KEY]
    records = state["records"]
    observations = [o for r in records for o in r.pop("observations", [])]
    panel: dict[str, list] = {}
    for r in records:
        for entry in r.pop("panel", []):
            panel.setdefault(r["implementation"], []).append(entry)
    seen = {d for r in records for d in r["divergences"]}
    witnessed = {o["key"]: o["value"] for o in observations if o["clause"] == "WITNESS"}
    divs = [{"id": e["id"], "clause": e["clause"], "kind": e["kind"], "region": e["region"], "reason": e["reason"],
             "link": e.get("link") or None, "implementations": e["implementations"], "observed": e["id"] in seen,
             "witness": witnessed.get(e["id"], "not run")} for e in state["entries"]]
    observations = [o for o in observations if o["clause"] != "WITNESS"]
    stamp = _dt.datetime.now(_dt.timezone.utc)
    env = _environment(config, state)
    return {
        "schema_version": 1,
        "run_id": f"{state['backend']}-{env['device']}-{stamp:%Y%m%dT%H%M%S}-{os.getpid():x}",
        "created": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": env, "records": records, "observations": observations, "panel": panel,
        "clause_coverage": coverage(records), "divergences": divs, "verdict": verdict(records),
    }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if RECORD_KEY not in config.stash or getattr(config, "workerinput", None) is not None:
        return
    run = _run_file(config)
    config.stash[RECORD_KEY]["run"] = run
    path = config.getoption("--report")
    if path:
        _write_run(Path(path), run)


def _write_run(path: Path, run: dict[str, Any]) -> None:
    try:
        from attnconf.reports import runfile

        runfile.write(path, run)
    except ImportError:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(run, indent=1, default=str))
        tmp.replace(path)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(RECORD_KEY, None)
    if not state or "run" not in state:
        return
    run = state["run"]
    tr = terminalreporter
    tr.section("attnconf")
    counts: dict[str, int] = {}
    for r in run["records"]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    tr.write_line(f"backend {state['backend']} on {run['environment']['device']}: "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for name in sorted({r["implementation"] for r in run["records"]}):
        worst = {}
        for r in run["records"]:
            if r["implementation"] == name:
                for dt, v in r["ratios"].items():
                    worst[dt] = max(worst.get(dt, 0.0), v["max"])
        if worst:
            tr.write_line(f"  {name}: worst error ratio " + ", ".join(f"{d} {v:.2f}" for d, v in sorted(worst.items())))
    for r in run["records"]:
        if r["status"] in FAILING:
            tr.write_line(f"  {r['status'].upper()} {r['nodeid']}: {r['message']}")
            if r.get("replay"):
                tr.write_line(f"    replay: {r['replay']}")
    tr.write_line(f"verdict: {verdict_line(run['verdict'])}", bold=True)
    if config.getoption("--report"):
        tr.write_line(f"report: {config.getoption('--report')}")
