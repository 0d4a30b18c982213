"""The suite's tests as the verdict needs them: which clauses each test checks, with which fixture and dtypes.

The verdict shows a clause whose tests did not run (deselected, another file chosen, stopped by --run-timeout)
as a cell that was not run rather than letting it disappear; for that it needs every test of the suite, not
only the ones pytest collected. This module is the one place where the engine reads the suite: the
declarations of the test functions (their `clauses` mark, `harness.for_cases`' dtypes and needs, the
`impl` / `layer_impl` fixture they take).
"""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Mapping


@dataclass
class PlannedTest:
    test: str
    fixture: str                 # "impl" (SDPA-style implementations) or "layer_impl"
    clauses: tuple[str, ...]
    dtypes: tuple[str, ...] | None   # None: not split into dtype cells
    opt_in: bool = False         # runs only when asked for (--long, --measure-memory)
    needs: tuple[str, ...] = ()  # features the property is about ("a|b": either); harness.for_cases
    shares_floor: bool = True    # others citing its clauses may draw fewer on its account (harness.cell_minimum)


def plan(collected: Mapping[str, ModuleType] | None = None) -> list[PlannedTest]:
    """Every test of the suite, read from the conformance test modules' declarations. `collected` maps the real
    path of each suite module that pytest collected in this run to that module (the plugin gathers them from
    its items, run_state.py): their declarations are read as pytest imported them, and only a module the run
    did not collect (another file chosen, a node id given) is imported here. Without it, the suite's modules
    already imported in this process stand in."""
    import attnconf.conformance as pkg

    out = []
    loaded = _loaded_by_file() if collected is None else collected
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("test_"):
            continue
        module = loaded.get(os.path.join(os.path.realpath(info.module_finder.path), f"{info.name}.py")) \
            or importlib.import_module(f"attnconf.conformance.{info.name}")
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
                continue
            marks = getattr(fn, "pytestmark", [])
            ids = tuple(c for m in marks if m.name == "clauses" for c in m.args)
            if not ids:
                continue
            fixture = getattr(fn, "attnconf_fixture", None)
            if fixture is None:
                params = inspect.signature(fn).parameters
                fixture = "layer_impl" if "layer_impl" in params else "impl" if "impl" in params else None
            if fixture is None:
                continue
            opt_in = any(m.name == "attnconf_opt_in" for m in marks)
            out.append(PlannedTest(name, fixture, ids, getattr(fn, "attnconf_dtypes", None), opt_in,
                                   tuple(getattr(fn, "attnconf_needs", ())),
                                   getattr(fn, "attnconf_shares_floor", True)))
    return out


def _loaded_by_file() -> dict[str, Any]:
    """Modules already imported, by the real path of their file. In a checkout pytest imports the suite's
    test modules as `conformance.test_*`: `plan` reads those rather than importing each file a second time
    as `attnconf.conformance.test_*` (which built every pinned case again: 3.4 of the 24 s of a profiled -x
    run, measured under load)."""
    out = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.basename(path).startswith("test_"):
            out[os.path.realpath(path)] = module
    return out
