"""attnconf: the conformance suite and specification for scaled dot-product attention.

One import name, five subpackages: `attnconf.spec`, `attnconf.reference`,
`attnconf.adapters`, `attnconf.conformance` and `attnconf.reports`. In a
checkout they are the top-level folders of the repository (so that
`pytest conformance --backend=torch` and the folder layout stay as they are),
found through the editable install `make setup` makes (setuptools maps each
folder to its `attnconf.` name, pyproject's package-dir). In an installed
wheel the same folders sit inside `attnconf/`, and nothing else is installed
at the top level of site-packages (see ARCHITECTURE.md, "Layout").
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__version__ = "0.2.0"


def _require_this_checkout_installed() -> None:
    """A checkout's attnconf/ without its editable install would fail later on `attnconf.spec` with a
    bare ModuleNotFoundError, and one installed from another checkout would silently run that
    checkout's code: either way say so here, once, with the fix."""
    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / "spec" / "clauses.toml").is_file():
        return   # an installed wheel: its folders are inside attnconf/
    found = importlib.util.find_spec(f"{__name__}.spec")
    where = Path(found.origin).resolve().parent if found and found.origin else None
    if where != checkout / "spec":
        raise ImportError(f"attnconf: the checkout {checkout} is not installed in this Python "
                          f"({sys.prefix}): run `make setup` there (it runs `pip install -e .`)"
                          + (f"; attnconf.spec is now found at {where}" if where else ""))


_require_this_checkout_installed()
