"""A test item's outcome as a record of the run file, and the failing case saved beside it.

The plugin's hooks call these once per item: the record (status, counts, ratios, observations) is
attached to the pytest report, so it crosses to the controller under pytest-xdist as well. A failing
record names its cause (causes.py), and the first failing case of each cause and clause is saved as
`.npz` with the command that replays it.
"""
from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from attnconf.conformance.engine.options import by_cli

if TYPE_CHECKING:
    from attnconf.reference import Case

    from attnconf.conformance.engine import harness

ROOT = Path(__file__).resolve().parents[2]        # the checkout, or the installed attnconf package
IN_CHECKOUT = (ROOT / ".git").exists() or (ROOT / "pyproject.toml").is_file()
RECORD_KEY = pytest.StashKey["harness.TestRecord"]()   # the item's record, kept by the harness as it runs
RESULT_KEY = pytest.StashKey[dict]()                    # when the item started, and a status set before its end


def impl_of(item: pytest.Item) -> str:
    """The implementation an item tests ("-" for an item no implementation parametrizes)."""
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


def dtype_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("dtype") if callspec is not None else None


def clauses_of(item: pytest.Item) -> list[str]:
    out: list[str] = []
    for mark in item.iter_markers("clauses"):
        out.extend(c for c in mark.args if c not in out)
    return out


def with_record(report: pytest.TestReport, record: dict[str, Any], rec: harness.TestRecord | None) -> pytest.TestReport:
    """Attach the record; the kernel outputs the test item kept for diagnosing are no longer needed."""
    if rec is not None:
        rec.outputs.clear()
    report.user_properties.append(("attnconf", record))
    return report


def cause(state: Any, rec: harness.TestRecord, case: Case, clause: str | None) -> tuple[str, tuple | None]:
    """The failure's cause (conformance/engine/causes.py) and, if its cause and clause have a saved case, that case."""
    from attnconf.conformance.engine import causes

    if state.keeper is None:
        state.keeper = causes.Keeper()
    try:
        found = causes.diagnose(case, rec.output_of(case), clause, others=rec.outputs)
    except Exception:   # noqa: BLE001 (a diagnosis must never lose the record)
        found = f"{causes.UNEXPLAINED}:{clause or 'ATTN-OP-1'}"
    return found, state.keeper.existing(found, clause or "ATTN-OP-1")


def primary(exc: BaseException) -> BaseException:
    """The first conformance failure inside an exception group (Hypothesis reports several so)."""
    from attnconf.conformance.engine import harness

    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            inner = primary(sub)
            if isinstance(inner, (harness.ConformanceFailure, harness.KernelAborted)):
                return inner
        return primary(exc.exceptions[0])
    return exc


def skip_reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    return str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


def record(item: pytest.Item, rec: harness.TestRecord | None, status: str, message: str | None) -> dict[str, Any]:
    """The run file's record of one item (reports/runfile.py's schema)."""
    started = item.stash.get(RESULT_KEY, {}).get("started")
    return {
        "nodeid": item.nodeid, "test": getattr(item, "originalname", item.name), "clauses": clauses_of(item),
        "implementation": impl_of(item), "dtype": dtype_of(item), "status": status,
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


def failures_dir(config: pytest.Config) -> Path:
    explicit = config.getoption("--failures-dir")
    if explicit:
        return Path(explicit)
    report = config.getoption("--report")
    if report:
        return Path(report).with_suffix("").parent / (Path(report).stem + "-failures")
    # never inside site-packages: an installed attnconf saves failing cases where it was run
    return ROOT / "reports" / "failures" if IN_CHECKOUT else Path.cwd() / "attnconf-failures"


def clear_saved_failures(folder: Path) -> None:
    """The cases saved beside a run file belong to that run file: a new run that replaces it removes them,
    so that every .npz left there is one the new run file names."""
    for old in folder.glob("*.npz") if folder.is_dir() else ():
        old.unlink(missing_ok=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80]


def save_failure(item: pytest.Item, case: Case) -> Path:
    path = failures_dir(item.config) / f"{_slug(item.name)}-{case.digest()}.npz"
    return case.save(path)


def replay_command(item: pytest.Item, path: Path) -> str:
    """The command that replays `path`: pytest from a checkout, `attnconf replay` from an installed suite or a
    run that `attnconf certify` started (its node ids are relative to the suite folder, not to the caller)."""
    cfg = item.config
    if IN_CHECKOUT and not by_cli(cfg):
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
            parts += ["--impl", impl_of(item)]
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
        parts.append(f"--impl={impl_of(item)}")
    if cfg.getoption("--allow-tf32"):
        parts.append("--allow-tf32")
    if cfg.getoption("--isolate"):
        parts.append("--isolate")
    if cfg.getoption("--divergences-dir"):
        parts.append(f"--divergences-dir={cfg.getoption('--divergences-dir')}")
    parts.append(f"--replay={path}")
    return " ".join(shlex.quote(p) for p in parts)
