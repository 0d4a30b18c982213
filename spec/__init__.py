"""Loaders for the machine-readable spec: clauses, tolerances, divergences.

Each fact is declared once in a TOML file beside this module; tests, the
plugin and the reports read it from here.
"""
from __future__ import annotations

import hashlib
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DIVERGENCE_FIELDS = {"id": str, "clause": str, "kind": str, "implementations": list, "region": str,
                     "reason": str, "witness": str}
DIVERGENCE_OPTIONAL = {"dtypes": list, "devices": list, "versions": str, "link": str, "scope": str,
                       "instead": str, "quantities": list, "bound": float, "value": float, "when": dict,
                       "measured": str, "finite_for": list}
DIVERGENCE_SCOPES = ("all", "forward", "gradients")
DIVERGENCE_KINDS = ("unsupported", "divergent", "bug")


class SpecError(ValueError):
    """A malformed spec data file (one-line message naming file, entry and field)."""


# A clause's level: "normative" (a kernel requirement, proven by a catalogue kernel the suite catches on it),
# "informative" (a theorem, example or procedure a kernel cannot violate on its own), "recorded" (observed and
# reported, never judged).
LEVELS = ("normative", "informative", "recorded")


@cache
def clauses() -> dict[str, dict[str, str]]:
    """Clause id -> {id, group, title, level, statement}, in spec order."""
    data = tomllib.loads((HERE / "clauses.toml").read_text())
    return {c["id"]: c for c in data["clause"]}


def normative() -> list[str]:
    """The ids of the kernel requirements (level "normative"), in spec order."""
    return [cid for cid, c in clauses().items() if c.get("level") == "normative"]


@cache
def tolerances() -> dict[str, dict[str, float]]:
    return tomllib.loads((HERE / "tolerances.toml").read_text())


@cache
def coverage() -> dict[str, int]:
    """The coverage floor of a verdict (SPEC §16)."""
    return tomllib.loads((HERE / "coverage.toml").read_text())["coverage"]


def _line_of(text: str, entry_index: int) -> int:
    count = -1
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip() == "[[divergence]]":
            count += 1
            if count == entry_index:
                return lineno
    return 0


def load_divergences(path: Path) -> list[dict[str, Any]]:
    """Parse and validate one divergence file; raise SpecError naming the line and field."""
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    entries = data.get("divergence", [])
    known = clauses()
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}:{_line_of(text, i)} (entry {entry.get('id', i)!r})"
        for name, typ in DIVERGENCE_FIELDS.items():
            if name not in entry:
                raise SpecError(f"{where}: missing field {name!r}")
            if not isinstance(entry[name], typ):
                raise SpecError(f"{where}: field {name!r} must be a {typ.__name__}")
        for name, typ in DIVERGENCE_OPTIONAL.items():
            if name in entry and not isinstance(entry[name], typ):
                raise SpecError(f"{where}: field {name!r} must be a {typ.__name__}")
        unknown = set(entry) - set(DIVERGENCE_FIELDS) - set(DIVERGENCE_OPTIONAL)
        if unknown:
            raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if entry["clause"] not in known:
            raise SpecError(f"{where}: field 'clause': no clause {entry['clause']!r} in spec/clauses.toml")
        if entry["kind"] not in DIVERGENCE_KINDS:
            raise SpecError(f"{where}: field 'kind' must be one of {', '.join(DIVERGENCE_KINDS)}")
        if entry.get("scope", "all") not in DIVERGENCE_SCOPES:
            raise SpecError(f"{where}: field 'scope' must be one of {', '.join(DIVERGENCE_SCOPES)}")
        out.append({"dtypes": [], "devices": [], "versions": "", "link": "", "scope": "all", **entry, "file": str(path)})
    return out


def divergences(backend: str, directory: Path) -> list[dict[str, Any]]:
    """The entries of `<directory>/<backend>.toml` (none if there is no such file). A backend's own
    divergences.toml lives in its pack: attnconf.conformance.engine.divergences.backend_entries finds it."""
    path = directory / f"{backend}.toml"
    return load_divergences(path) if path.exists() else []


@cache
def spec_hash() -> str:
    """sha256 over SPEC.md and every TOML file of the spec (the backends' divergence files are their packs')."""
    h = hashlib.sha256()
    for p in sorted([*HERE.glob("*.toml"), *HERE.glob("*.md")]):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()
