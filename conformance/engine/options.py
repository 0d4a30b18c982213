"""The command-line options of an attnconf run, and the harness session they build.

`--backend` and the options beside it are validated here once, when the run is configured: each bad
value is a one-line usage error naming the option, before any test runs. What they describe (the
implementations, isolated or not, the divergence entries, a replayed case, the deadline) becomes the
`harness.Session` that the run state (run_state.py) keeps.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from attnconf.adapters.registry import REGISTRY
from attnconf.spec.vocabulary import PROFILES

if TYPE_CHECKING:   # imported when a run starts: an inert plugin costs no NumPy import
    from attnconf.conformance.engine import harness

DEFAULT_RUN_TIMEOUT_S = 1800.0
SUITE_INI = "pytest-attnconf.ini"     # the configuration `attnconf certify` and `attnconf replay` run the suite with


def add_options(parser: pytest.Parser) -> None:
    """The attnconf group of pytest's options."""
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
    g.addoption("--divergences-dir", default=None, help="folder of <backend>.toml divergence files (default: the pack's divergences.toml)")
    g.addoption("--long", action="store_true", help="also check long sequences against the tiled reference (ATTN-LONG-1)")
    g.addoption("--measure-memory", action="store_true", help="record peak memory against sequence length (ATTN-PROP-7)")


def register_profiles() -> None:
    """The Hypothesis profiles dev, ci (the certification profile) and thorough (idempotent)."""
    from hypothesis import HealthCheck, Phase, settings

    _HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
               HealthCheck.large_base_example, HealthCheck.differing_executors]
    settings.register_profile("dev", max_examples=15, deadline=None, suppress_health_check=_HEALTH)
    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None, print_blob=True,
                              suppress_health_check=_HEALTH, phases=[Phase.explicit, Phase.generate, Phase.shrink])
    settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=_HEALTH)


def wants_profiles(config: pytest.Config) -> bool:
    """Whether this run needs attnconf's Hypothesis profiles (registered before Hypothesis loads one)."""
    return bool(config.getoption("--backend")) or config.getoption("--hypothesis-profile", default=None) in PROFILES


def usage(msg: str) -> NoReturn:
    raise pytest.UsageError(msg)


def by_cli(config: pytest.Config) -> bool:
    """Whether `attnconf certify` / `replay` started this run (their -c ini, the suite folder as rootdir)."""
    return config.inipath is not None and config.inipath.name == SUITE_INI


def build_session(config: pytest.Config) -> harness.Session:
    """The harness session the options describe; a bad option is a usage error naming it."""
    from attnconf import adapters, spec
    from attnconf.reference import Case

    from attnconf.conformance.engine import harness
    from attnconf.conformance.engine.divergences import DivergenceError, Divergences, backend_entries

    backend = config.getoption("--backend")
    options = {"allow_tf32": config.getoption("--allow-tf32")}
    try:
        impls = adapters.load(backend, device=config.getoption("--device"), kernel=config.getoption("--kernel"),
                              impl=config.getoption("--impl"), options=options,
                              convention=config.getoption("--convention"),
                              capabilities=config.getoption("--capabilities"))
    except adapters.UsageError as exc:
        usage(str(exc))
    if config.getoption("--isolate"):
        impls = _isolate(config, impls, options)
    from attnconf.conformance.engine.regions import load_all as load_regions
    from attnconf.conformance.engine.witnesses import load_all as load_witnesses

    load_regions()
    load_witnesses()
    try:
        folder = config.getoption("--divergences-dir")
        entries = backend_entries(backend, Path(folder) if folder else None)
        from attnconf.conformance.engine.alternatives_contracts import contract_entries

        entries = entries + contract_entries(impls)     # a declared accuracy contract (SPEC section 29)
        divs = Divergences(entries, config.getoption("--device"))
        from attnconf.conformance.engine.declared import entries as declared_entries

        divs.entries += [e for a in impls for e in declared_entries(a)]     # the kernels' documented behaviour
    except (spec.SpecError, DivergenceError, ValueError) as exc:
        usage(f"malformed divergence file: {exc}")
    report = config.getoption("--report")
    if report:
        _check_writable(Path(report))
    replay = None
    if config.getoption("--replay"):
        try:
            replay = Case.load(config.getoption("--replay"))
        except Exception as exc:
            usage(f"--replay {config.getoption('--replay')}: cannot load the case: {type(exc).__name__}: {exc}")
    seed = config.getoption("--hypothesis-seed", default=None)
    run_timeout = config.getoption("--run-timeout")
    return harness.Session(
        backend=backend, impls=impls, divergences=divs, device=config.getoption("--device"), replay=replay,
        long=config.getoption("--long"), measure_memory=config.getoption("--measure-memory"),
        seed=int(seed) if seed not in (None, "") else None, case_timeout=config.getoption("--case-timeout"),
        max_timeouts=config.getoption("--max-timeouts"),
        deadline=time.time() + run_timeout if run_timeout and run_timeout > 0 else None,
        entries=divs.entries, options=options)


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f".attnconf-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        usage(f"--report {path}: cannot write there: {exc.strerror or exc}")
    if path.is_dir():
        usage(f"--report {path}: is a directory; give a file path")


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
