"""A kernel's declared scope: what it claims to do, and therefore what it is certified for.

A kernel declares its scope with a plain dict attribute on the callable, so that
its module need not import attnconf:

    flash_attn_func.attnconf_capabilities = {
        "dtypes": ["float16", "bfloat16"],   # dtype names (default: the convention's)
        "grads": False,                      # has a backward (default: the convention's)
        "dropout": True,                     # honours dropout_p (default: the convention's)
        "features": ["causal_bottom_right", "window_bottom_right", "softcap", "gqa", "lse", ...],
        "head_dims": [64, 128],              # or {"max": 256}
        "max_seqlen": 8192,                  # longest Lq or Lk
        "deterministic": False,              # reruns may differ bitwise (default true: ATTN-DET-1)
    }

or from outside with `--capabilities=FILE.toml` holding the same keys at top level
(or under one `[attnconf_capabilities]` table); the file wins over the attribute.
A missing attribute means the full scope of the calling convention; a missing
key means the convention's value for that key. `features` names the spec's
features (`Case.features()`, `adapters.base.CAPABILITIES`); declaring one the
convention cannot express, an unknown key or an unknown name is a one-line
`ScopeError`. The declaration becomes the adapter's `dtypes`, `capabilities`,
`head_dims`, `max_head_dim` and `max_seqlen`, so every case outside it is
recorded as unsupported (never as passed), and `Adapter.scope()` reports it in
the same words for the certificate (`scope_sentence`).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import CAPABILITIES, SCOPE_KEYS, Adapter
from .contract import CONTRACT_KEYS, Contract, ContractError
from .contract import parse as parse_contract

ATTRIBUTE = "attnconf_capabilities"
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")


class ScopeError(ValueError):
    """A malformed scope declaration (one-line message naming the source and the key)."""


@dataclass(frozen=True)
class Scope:
    """A complete scope: every key has a value (the declaration's, else the convention's)."""

    dtypes: tuple[str, ...]
    grads: bool
    dropout: bool
    features: frozenset[str]          # without "grads" and "dropout"
    head_dims: tuple[int, ...] | None = None
    max_head_dim: int | None = None
    max_seqlen: int | None = None
    source: str = "built-in"
    contract: Contract | None = None  # documented behaviour and limits (adapters/contract.py)
    deterministic: bool = True

    @classmethod
    def of(cls, adapter: Adapter) -> "Scope":
        """The scope an adapter has now (for a kernel adapter: its convention's full scope)."""
        caps = set(adapter.capabilities)
        return cls(tuple(adapter.dtypes), "grads" in caps, "dropout" in caps,
                   frozenset(caps - {"grads", "dropout"}), adapter.head_dims, adapter.max_head_dim,
                   adapter.max_seqlen, adapter.scope_source, adapter.contract, adapter.deterministic)

    def capabilities(self) -> frozenset[str]:
        return self.features | ({"grads"} if self.grads else set()) | ({"dropout"} if self.dropout else set())


def _names(value: Any, what: str, source: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ScopeError(f"{source}: {what!r} must be a list of names; got {value!r}")
    return list(value)


def _bool(value: Any, what: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise ScopeError(f"{source}: {what!r} must be true or false; got {value!r}")
    return value


def _positive(value: Any, what: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ScopeError(f"{source}: {what!r} must be a positive integer; got {value!r}")
    return value


def parse(decl: Any, *, source: str, full: Scope, expressible: frozenset[str] | None = None,
          convention: str = "this") -> Scope:
    """Validate a declaration and complete it with `full` (the convention's scope) for every missing key.

    `expressible` is every feature the convention can pass to a kernel (default: `full.features`):
    a kernel may declare any of them, even one the convention's default scope leaves out.
    """
    if not isinstance(decl, dict):
        raise ScopeError(f"{source}: must be a dict of {', '.join(SCOPE_KEYS)}; got {type(decl).__name__}")
    unknown = sorted(set(decl) - set(SCOPE_KEYS) - set(CONTRACT_KEYS))
    if unknown:
        raise ScopeError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}; known keys: "
                         f"{', '.join(SCOPE_KEYS + CONTRACT_KEYS)}")
    try:
        contract = parse_contract(decl, source=source, convention=convention)
    except ContractError as exc:
        raise ScopeError(f"{source}: {exc}") from None
    expressible = full.features if expressible is None else expressible

    dtypes = full.dtypes
    if "dtypes" in decl:
        names = _names(decl["dtypes"], "dtypes", source)
        bad = [n for n in names if n not in DTYPE_NAMES]
        if bad:
            raise ScopeError(f"{source}: unknown dtype(s) {', '.join(bad)}; known: {', '.join(DTYPE_NAMES)}")
        if not names:
            raise ScopeError(f"{source}: 'dtypes' is empty: a kernel that runs no dtype cannot be certified")
        outside = [n for n in names if n not in full.dtypes]
        if outside:
            raise ScopeError(f"{source}: the {convention} convention does not run {', '.join(outside)}")
        dtypes = tuple(d for d in DTYPE_NAMES if d in names)

    features = full.features
    listed: set[str] = set()
    if "features" in decl:
        listed = set(_names(decl["features"], "features", source))
        bad = sorted(listed - CAPABILITIES)
        if bad:
            raise ScopeError(f"{source}: unknown feature(s) {', '.join(bad)}; known: {', '.join(sorted(CAPABILITIES))}")
        outside = sorted(listed - expressible - {"grads", "dropout"})
        if outside:
            raise ScopeError(f"{source}: the {convention} convention cannot express {', '.join(outside)}")
        features = frozenset(listed - {"grads", "dropout"})

    flags = {}
    for key, default in (("grads", full.grads), ("dropout", full.dropout)):
        value = _bool(decl[key], key, source) if key in decl else (key in listed or default)
        if key in decl and "features" in decl and key in listed and not value:
            raise ScopeError(f"{source}: {key!r} is false but 'features' lists {key}")
        if value and not default and key not in expressible:
            raise ScopeError(f"{source}: the {convention} convention has no {'backward' if key == 'grads' else key}")
        flags[key] = value

    head_dims, max_head_dim = full.head_dims, full.max_head_dim
    if "head_dims" in decl:
        hd = decl["head_dims"]
        if isinstance(hd, dict):
            if set(hd) != {"max"}:
                raise ScopeError(f"{source}: 'head_dims' as a table takes only 'max'; got {', '.join(map(str, hd))}")
            head_dims, max_head_dim = None, _positive(hd["max"], "head_dims.max", source)
            if full.max_head_dim is not None and max_head_dim > full.max_head_dim:
                raise ScopeError(f"{source}: head_dims max {max_head_dim} exceeds the convention's {full.max_head_dim}")
        elif isinstance(hd, (list, tuple)) and hd:
            head_dims = tuple(sorted({_positive(d, "head_dims", source) for d in hd}))
            max_head_dim = None
        else:
            raise ScopeError(f"{source}: 'head_dims' must be a non-empty list of integers or {{max = N}}; got {hd!r}")
    max_seqlen = _positive(decl["max_seqlen"], "max_seqlen", source) if "max_seqlen" in decl else full.max_seqlen
    if contract is not None and contract.representations is not None:   # a layout or cache it does not take
        reps = contract.representations
        features -= {f for f in ("noncontiguous", "broadcast_kv") if f not in reps}
        if not reps & {"paged", "page_size_256", "page_size_512"}:
            features -= {"paged"}
    deterministic = _bool(decl["deterministic"], "deterministic", source) if "deterministic" in decl else full.deterministic
    return Scope(dtypes, flags["grads"], flags["dropout"], features, head_dims, max_head_dim, max_seqlen, source,
                 contract, deterministic)


def read_toml(path: str | Path) -> dict[str, Any]:
    """The declaration in a TOML file: top-level keys, or one [attnconf_capabilities] / [capabilities] table."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ScopeError(f"--capabilities {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScopeError(f"--capabilities {path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScopeError(f"--capabilities {path}: not valid TOML: {exc}") from None
    for table in (ATTRIBUTE, "capabilities"):
        if set(data) == {table} and isinstance(data[table], dict):
            return data[table]
    return data


def declaration(fn: Any, capabilities_file: str | None) -> tuple[Any, str] | None:
    """(declaration, source) from the file if given, else from the kernel's attribute; None if neither."""
    if capabilities_file:
        return read_toml(capabilities_file), f"--capabilities {capabilities_file}"
    if hasattr(fn, ATTRIBUTE):
        name = getattr(fn, "__qualname__", getattr(fn, "__name__", "kernel"))
        return getattr(fn, ATTRIBUTE), f"{name}.{ATTRIBUTE}"
    return None


def apply(adapter: Adapter, scope: Scope) -> Adapter:
    """Make the adapter's declaration the scope's (so supports() says unsupported outside it)."""
    adapter.dtypes = scope.dtypes
    adapter.capabilities = scope.capabilities()
    adapter.head_dims, adapter.max_head_dim, adapter.max_seqlen = scope.head_dims, scope.max_head_dim, scope.max_seqlen
    adapter.scope_source = scope.source
    adapter.contract = scope.contract
    adapter.deterministic = scope.deterministic
    return adapter


def declare(adapter: Adapter, fn: Any, capabilities_file: str | None, *,
            expressible: frozenset[str] | None = None) -> Adapter:
    """Apply the kernel's declared scope, if any, on top of its convention's full scope."""
    found = declaration(fn, capabilities_file)
    if found is None:
        adapter.scope_source = f"full {adapter.convention or 'calling'} convention (no declaration)"
        return adapter
    decl, source = found
    apply(adapter, parse(decl, source=source, full=Scope.of(adapter), expressible=expressible,
                         convention=adapter.convention or adapter.backend))
    if isinstance(decl, dict) and ("quantization" in decl or "accuracy" in decl):
        from .accuracy_contract import ContractError as AccuracyContractError, parse as parse_contract

        try:
            adapter.accuracy_contract = parse_contract(decl, source)
        except AccuracyContractError as exc:
            raise ScopeError(str(exc)) from None
    return adapter


# ---- the certificate's words -------------------------------------------------------------------
FEATURE_WORDS = {
    "mask": "boolean masks", "bias": "additive bias", "causal_top_left": "causal top-left",
    "causal_bottom_right": "causal bottom-right", "q_lengths": "query padding", "kv_lengths": "key padding",
    "gqa": "GQA/MQA", "custom_scale": "custom scale", "dv_ne_dk": "Dv != Dk", "cross": "Lq != Lk",
    "mask_with_causal": "mask with causal", "lse": "log-sum-exp", "weights": "attention weights",
    "dbias": "bias gradient", "noncontiguous": "non-contiguous inputs", "broadcast_kv": "broadcast K/V",
    "window_top_left": "sliding window top-left", "window_bottom_right": "sliding window bottom-right",
    "softcap": "softcap", "alibi": "ALiBi", "alibi_top_left": "ALiBi distances aligned top-left",
    "sinks": "attention sinks", "chunk_bottom_right": "chunked local attention bottom-right",
    "chunk_top_left": "chunked local attention top-left", "varlen": "variable-length packing",
    "paged": "paged KV cache", "kvcache_append": "KV-cache append", "grads": "gradients", "dropout": "dropout",
}


def scope_sentence(scope: dict[str, Any]) -> str:
    """One sentence for a certificate from `Adapter.scope()`:
    "certified for float16/bfloat16, forward only, ...; not covered: ...; outside the convention: ..."."""
    parts = ["/".join(scope["dtypes"]), "forward and gradients" if scope["grads"] else "forward only"]
    parts.append("dropout" if scope["dropout"] else "no dropout")
    parts += [FEATURE_WORDS.get(f, f) for f in scope["features"]]
    limits = scope.get("limits") or {}
    hd = limits.get("head_dims")
    if isinstance(hd, dict):
        parts.append(f"head dim <= {hd['max']}")
    elif hd:
        parts.append("head dims " + "/".join(map(str, hd)))
    if limits.get("max_seqlen"):
        parts.append(f"sequences up to {limits['max_seqlen']}")
    if scope.get("deterministic") is False:
        parts.append("declared nondeterministic (reruns not required to be bitwise equal; their spread is recorded)")
    text = "certified for " + ", ".join(parts)
    missing = [d for d in DTYPE_NAMES if d not in scope["dtypes"]]
    missing += [] if scope["grads"] else ["gradients"]
    missing += [FEATURE_WORDS.get(f, f) for f in scope.get("not_covered", []) if f not in ("grads", "dropout")]
    if missing:
        text += "; not covered: " + ", ".join(missing)
    if scope.get("outside_convention"):
        text += f"; outside the {scope.get('convention')} convention: " + ", ".join(scope["outside_convention"])
    return text
