"""Which declared divergences (a backend pack's divergences.toml) hold here, and what they cover in a case.

Entries are loaded and field-checked by `attnconf.spec.load_divergences`; this module checks what
the spec loader cannot (known region, alternative and witness; a bound where the region is "any"),
evaluates each entry's conditions (`when`: devices, CPU flags, package versions) once, and for an
(implementation, case) returns every entry that applies with the elements it covers.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np

from attnconf.conformance.engine.alternatives import ALTERNATIVES, FORWARD, GRADIENTS
from attnconf.conformance.engine.regions import CASE_REGIONS, REGIONS, rows_of, touches

GRADIENT_CLAUSES = {"ATTN-GRAD-1", "ATTN-GRAD-2", "ATTN-EMPTY-3", "ATTN-TOL-5"}


class DivergenceError(ValueError):
    """A divergence entry that cannot be used (one line naming file, entry and field)."""


def backend_entries(backend: str, directory: Path | None = None) -> list[dict[str, Any]]:
    """A backend's declared divergences: `<directory>/<backend>.toml` when a folder is given
    (--divergences-dir), else the divergences.toml of its pack (found through the registry)."""
    from attnconf import spec
    from attnconf.adapters.registry import divergences_file

    if directory is not None:
        return spec.divergences(backend, directory)
    path = divergences_file(backend)
    return spec.load_divergences(path) if path is not None else []


# ---- conditions ----------------------------------------------------------------------------

@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (Linux /proc/cpuinfo); empty where unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cpu_expression(text: str) -> ast.Expression:
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BoolOp, ast.UnaryOp, ast.Name, ast.And, ast.Or, ast.Not,
                                 ast.Load)):
            raise ValueError(f"only flag names, and, or, not and parentheses are allowed, not {type(node).__name__}")
    return tree


def _eval_cpu(node: ast.AST, flags: frozenset[str]) -> bool:
    if isinstance(node, ast.Expression):
        return _eval_cpu(node.body, flags)
    if isinstance(node, ast.Name):
        return node.id in flags
    if isinstance(node, ast.UnaryOp):
        return not _eval_cpu(node.operand, flags)
    values = [_eval_cpu(v, flags) for v in node.values]
    return all(values) if isinstance(node.op, ast.And) else any(values)


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def conditions_hold(when: dict[str, Any], device: str) -> tuple[bool, str]:
    """(holds, why): whether every condition of `when` holds on this machine and device."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if "devices" in when and device not in when["devices"]:
        return False, f"device {device} not in {when['devices']}"
    if "cpu" in when:
        if not _eval_cpu(_cpu_expression(when["cpu"]), cpu_flags()):
            return False, f"this CPU does not satisfy {when['cpu']!r}"
    for dist, spec_ in (when.get("packages") or {}).items():
        have = _installed_version(dist)
        if have is None:
            return False, f"{dist} is not installed"
        if Version(have) not in SpecifierSet(spec_):
            return False, f"{dist} {have} is outside {spec_}"
    return True, "conditions hold" if when else "unconditional"


# ---- entries ---------------------------------------------------------------------------------

@dataclass
class Applied:
    """One entry that applies to a case: its covered rows (None = the whole case) and quantities."""

    entry: dict[str, Any]
    rows: np.ndarray | None

    @property
    def id(self) -> str:
        return self.entry["id"]

    @property
    def instead(self) -> str:
        return self.entry["instead"]

    def masks(self, case, res) -> dict[str, np.ndarray]:
        """Covered elements per quantity present in `res` (and defined by the alternative)."""
        alt = ALTERNATIVES[self.instead]
        wanted = [q for q in self.entry["quantities"] if q in alt.defines or "layer" in alt.defines and q == "out"]
        out: dict[str, np.ndarray] = {}
        for q in wanted:
            arr = _quantity(res, q)
            if arr is not None:
                out[q] = covered_elements(case, self.rows, q, np.shape(arr))
        return out


def _quantity(res, q: str):
    if q in ("out", "lse", "weights"):
        return getattr(res, q, None)
    return None if not res.grads else res.grads.get(q)


def covered_elements(case, rows: np.ndarray | None, quantity: str, shape: tuple[int, ...]) -> np.ndarray:
    """The elements of one result array (of `shape`) that covered rows determine."""
    if rows is None:
        return np.ones(shape, dtype=bool)
    if quantity in ("out", "dq", "weights"):
        return np.broadcast_to(rows[..., None], shape).copy()
    if quantity == "lse":
        return rows.copy()
    s = case.shape
    if quantity in ("dk", "dv"):               # every key of a (batch, KV head) some covered row could reach
        grp = rows.reshape(s["B"], s["Hkv"], s["Hq"] // s["Hkv"], s["Lq"]).any(axis=(2, 3))
        return np.broadcast_to(grp[:, :, None, None], shape).copy()
    if quantity == "dbias":
        full = np.broadcast_to(rows[..., None], (s["B"], s["Hq"], s["Lq"], s["Lk"]))
        from attnconf.reference.backward import reduce_to_shape

        return reduce_to_shape(full.astype(np.float64), shape) > 0
    raise ValueError(f"unknown quantity {quantity!r}")


class Divergences:
    """The entries of one backend on one device, validated, with their conditions evaluated."""

    def __init__(self, entries: list[dict[str, Any]], device: str):
        from attnconf.conformance.engine.alternatives import load_all as load_alternatives
        from attnconf.conformance.engine.regions import load_all as load_regions
        from attnconf.conformance.engine.witnesses import WITNESSES
        from attnconf.conformance.engine.witnesses import load_all as load_witnesses

        load_alternatives()
        load_regions()
        load_witnesses()
        self.device = device
        self.entries: list[dict[str, Any]] = []
        for e in entries:
            self.entries.append(_normalise(e, WITNESSES))
        for e in self.entries:
            e["holds"], e["condition"] = conditions_hold(e["when"], device)

    def for_impl(self, impl_name: str, *, active_only: bool = True) -> list[dict[str, Any]]:
        return [e for e in self.entries if any(fnmatch(impl_name, p) for p in e["implementations"])
                and (e["holds"] or not active_only)]

    def applied(self, impl_name: str, case, *, grads: bool = False) -> list[Applied]:
        """Every active entry whose implementation, dtype and region cover some of `case`."""
        out = []
        for e in self.for_impl(impl_name):
            if e["dtypes"] and case.dtype not in e["dtypes"]:
                continue
            if not grads and not set(e["quantities"]) & {"out", "lse", "call", "weights"}:
                continue            # an entry about gradients only does not touch a forward call
            rows = rows_of(e["region"], case)
            if touches(rows):
                out.append(Applied(e, rows))
        return out


def _normalise(entry: dict[str, Any], witnesses: dict) -> dict[str, Any]:
    """Fill defaults (old field names included) and check what the TOML loader cannot."""
    e = dict(entry)
    where = f"{e.get('file', '?')}: entry {e['id']!r}"
    if e["region"] not in REGIONS:
        raise DivergenceError(f"{where}: field 'region': unknown region {e['region']!r}; "
                              f"known: {', '.join(sorted(REGIONS))}")
    if e["witness"] not in witnesses:
        raise DivergenceError(f"{where}: field 'witness': unknown witness {e['witness']!r}; "
                              f"known: {', '.join(sorted(witnesses))}")
    if "instead" not in e:
        raise DivergenceError(f"{where}: missing field 'instead' (what the implementation does instead; "
                              f"one of {', '.join(sorted(ALTERNATIVES))})")
    if e["instead"] not in ALTERNATIVES:
        raise DivergenceError(f"{where}: field 'instead': unknown alternative {e['instead']!r}; "
                              f"known: {', '.join(sorted(ALTERNATIVES))}")
    alt = ALTERNATIVES[e["instead"]]
    takes = ", ".join(n for n, a in ALTERNATIVES.items() if a.takes_bound)
    if e["region"] == "any" and not alt.takes_bound:
        raise DivergenceError(f"{where}: region 'any' covers everything; it needs an alternative held to a stated "
                              f"bound ({takes}), not {e['instead']!r}")
    needs_bound = e["region"] == "any" or e["instead"] == "bounded"
    bound = e.get("bound")
    if needs_bound and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0):
        raise DivergenceError(f"{where}: {'region = any' if e['region'] == 'any' else 'instead = bounded'} needs a "
                              f"positive numeric field 'bound' (the factor on the alternative's allowance)")
    if bound is not None and not alt.takes_bound:
        raise DivergenceError(f"{where}: field 'bound': {e['instead']!r} takes no bound (those that do: {takes})")
    if e["instead"] == "finite_mask_bias" and not isinstance(e.get("value"), (int, float)):
        raise DivergenceError(f"{where}: instead = 'finite_mask_bias' needs a numeric field 'value'")
    if "finite_for" in e:
        from attnconf.conformance.engine.alternatives import FINITE_SOURCES
        bad = [x for x in e["finite_for"] if x not in FINITE_SOURCES]
        if e["instead"] != "finite_mask_bias" or bad or not e["finite_for"]:
            raise DivergenceError(f"{where}: field 'finite_for' goes with instead = 'finite_mask_bias' and lists some "
                                  f"of {', '.join(FINITE_SOURCES)}" + (f" (not {', '.join(map(repr, bad))})" if bad else ""))
    if e["instead"] in ("raises", "returns") and e["region"] not in CASE_REGIONS:
        raise DivergenceError(f"{where}: instead = {e['instead']!r} concerns a whole call; its region must be a "
                              f"case region ({', '.join(sorted(CASE_REGIONS))})")
    when = dict(e.get("when") or {})
    if e.get("devices"):
        when.setdefault("devices", list(e["devices"]))
    unknown = set(when) - {"devices", "cpu", "packages"}
    if unknown:
        raise DivergenceError(f"{where}: field 'when': unknown condition(s) {', '.join(sorted(unknown))}; "
                              f"known: devices, cpu, packages")
    if "cpu" in when:
        try:
            _cpu_expression(when["cpu"])
        except (SyntaxError, ValueError) as exc:
            raise DivergenceError(f"{where}: field 'when.cpu': {exc}") from None
    if "packages" in when:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        for dist, spec_ in when["packages"].items():
            try:
                SpecifierSet(spec_)
            except InvalidSpecifier:
                raise DivergenceError(f"{where}: field 'when.packages': {dist} = {spec_!r} is not a PEP 440 "
                                      f"specifier") from None
    e["when"] = when
    if "quantities" not in e:
        scope = e.get("scope", "all")
        if alt.defines == ("call",):
            e["quantities"] = list(GRADIENTS) if scope == "gradients" else ["call"]
        elif scope == "gradients" or e["clause"] in GRADIENT_CLAUSES:
            e["quantities"] = list(GRADIENTS)
        else:
            e["quantities"] = list(FORWARD)
    bad = set(e["quantities"]) - set(FORWARD + GRADIENTS + ("call", "weights"))
    if bad:
        raise DivergenceError(f"{where}: field 'quantities': unknown {', '.join(sorted(bad))}")
    e.setdefault("measured", e.get("versions", ""))
    return e
