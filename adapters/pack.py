"""What a backend pack is made of, and the lazy face its `__init__.py` shows.

A backend pack is a package (the built-in ones: `attnconf.adapters.<backend>`) that holds everything
that is one backend's: its adapter module (`adapter.py`, the registry's adapter module protocol:
`implementations`, `kernel_adapter`, optionally `check_kernel_signature` and `DEVICES`), and,
optionally, `regions.py`, `alternatives.py`, `witnesses.py` (the engine's plug-ins, registered by
import), `divergences.toml`, `witnesses/*.npz` (stored witness cases), `findings/` and `tests/`.

The engine imports every pack's regions, alternatives and witnesses in every run (a divergence file
may name any of them), so importing a pack must not import its framework: the pack's `__init__.py`
declares `__getattr__ = face(__name__)`, which reads the protocol from `adapter.py` on first use.
Nothing here imports a framework or the engine.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

ADAPTER = "adapter"
POWERS = ("regions", "alternatives", "witnesses")
DIVERGENCES = "divergences.toml"


def face(package: str, adapter: str = ADAPTER) -> Callable[[str], Any]:
    """A module `__getattr__` for a pack: attributes come from its adapter module, imported on first use."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):      # introspection (copy, pickle, pytest) must not import the framework
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f"{package}.{adapter}")
        if name == adapter:
            return module
        pack = vars(sys.modules[package])
        if name in pack:               # a submodule the adapter module imported
            return pack[name]
        return getattr(module, name)

    return __getattr__


def folder(package: str) -> Path | None:
    """The folder of a package, found without executing it (None: not a package, or not installed)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def power_modules(package: str, power: str) -> list[str]:
    """The import name of the pack's `power` module (regions, alternatives, witnesses) if it has one."""
    if power not in POWERS:
        raise ValueError(f"unknown pack module {power!r}; known: {', '.join(POWERS)}")
    where = folder(package)
    if where is None:
        return []
    present = (where / f"{power}.py").is_file() or (where / power / "__init__.py").is_file()
    return [f"{package}.{power}"] if present else []


def divergences_file(package: str) -> Path | None:
    """The pack's `divergences.toml`, if it has one."""
    where = folder(package)
    path = where / DIVERGENCES if where is not None else None
    return path if path is not None and path.is_file() else None
