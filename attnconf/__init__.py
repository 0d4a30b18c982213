"""attnconf: the conformance suite and specification for scaled dot-product attention.

One import name, five subpackages: `attnconf.spec`, `attnconf.reference`,
`attnconf.adapters`, `attnconf.conformance` and `attnconf.reports`. In a
checkout they are the top-level folders of the repository (so that
`pytest conformance --backend=torch` and the folder layout stay as they are):
this package's `__path__` also covers the repository root. In an installed
wheel the same folders sit inside `attnconf/`, and nothing else is installed
at the top level of site-packages (see ARCHITECTURE.md, "Layout").
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0"

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent
if not (_HERE / "spec").is_dir() and (_CHECKOUT / "spec" / "clauses.toml").is_file():
    __path__.append(str(_CHECKOUT))  # type: ignore[name-defined]  # noqa: F821
