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

`Scope` is the one description of a scope, whoever holds it: `Scope.of(adapter)` reads
an implementation's, `Scope.from_record(d)` a run file's. It answers the three
questions every part of attnconf asks of a scope, each in one place: does this case
fit (`fit`: True or the one-line reason, what `Adapter.supports` says), which
features may generation draw (`allows`), and what is certified, in one sentence
for the certificate (`words`, `sentence`).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from attnconf.spec.vocabulary import CAPABILITIES, DTYPES

from .contract import CONTRACT_KEYS, Contract, ContractError
from .contract import parse as parse_contract

# any adapter (adapters.base.Adapter or a subclass): typed by a TypeVar so that this module, which
# base imports, does not import base back
Adapter = TypeVar("Adapter")

ATTRIBUTE = "attnconf_capabilities"
# What a declaration says besides features; `Scope.as_dict` uses the same words.
SCOPE_KEYS = ("dtypes", "grads", "dropout", "features", "head_dims", "max_seqlen", "deterministic",
              "quantization", "accuracy")    # the last two: an approximate kernel's contract (adapters/accuracy_contract.py)


# ---- the certificate's words for each capability (CAPABILITIES) ------------------------------
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
    "sparse_indices": "top-k sparse key indices", "latent": "MLA latent keys",
}


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
    convention: str = ""              # the calling convention of a third-party kernel; "" for a built-in
    expressible: frozenset[str] | None = None   # every feature its convention can express (None: all of them)
    outside: tuple[str, ...] = ()     # what lies outside the convention, in words
    name: str = ""                    # the implementation, named in the reasons `fit` gives

    @classmethod
    def of(cls, impl: Any) -> "Scope":
        """The scope an implementation has now (for a kernel adapter: its convention's full scope, or its
        declaration once `declare` applied it)."""
        caps = set(impl.capabilities)
        return cls(tuple(impl.dtypes), "grads" in caps, "dropout" in caps, frozenset(caps - {"grads", "dropout"}),
                   impl.head_dims, getattr(impl, "max_head_dim", None), impl.max_seqlen, impl.scope_source,
                   impl.contract, impl.deterministic, impl.convention,
                   getattr(impl, "expressible", None), tuple(getattr(impl, "outside_convention", ())), impl.name)

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "Scope":
        """The scope a run file recorded (`Adapter.scope()`'s words, limits nested or flattened); keys a
        recorder left out take the widest value, so an old run file still reads."""
        limits = {**d, **(d.get("limits") or {})}
        head_dims, max_head_dim = limits.get("head_dims"), limits.get("max_head_dim")
        if isinstance(head_dims, dict):
            head_dims, max_head_dim = None, head_dims.get("max", max_head_dim)
        features = set(d.get("features") or ())
        grads = bool(d.get("grads")) or "grads" in features
        dropout = bool(d.get("dropout")) or "dropout" in features
        features -= {"grads", "dropout"}
        expressible = (frozenset(features | set(d["not_covered"]) | {"grads", "dropout"})
                       if d.get("not_covered") is not None else None)
        return cls(tuple(x for x in DTYPES if x in (d.get("dtypes") or ())), grads, dropout, frozenset(features),
                   tuple(head_dims) if head_dims else None, max_head_dim, limits.get("max_seqlen"),
                   str(d.get("source") or "built-in"), None, d.get("deterministic") is not False,
                   d.get("convention") or "", expressible, tuple(d.get("outside_convention") or ()))

    def ordered_dtypes(self) -> list[str]:
        return [d for d in DTYPES if d in self.dtypes]

    def capabilities(self) -> frozenset[str]:
        return self.features | ({"grads"} if self.grads else set()) | ({"dropout"} if self.dropout else set())

    def allows(self, *features: str) -> bool:
        """Whether the scope declares every one of `features` (what generation may draw)."""
        return set(features) <= self.capabilities()

    # ---- does a case fit ------------------------------------------------------------------
    def fit(self, case: Any, need: frozenset[str] | set[str] = frozenset(), *,
            requirements: set[str] | None = None) -> Literal[True] | str:
        """True if `case` (a Case or a LayerCase) lies inside the scope, else the one-line reason: a feature it
        lacks, its dtype, then its limits. `requirements` are the features the case exercises in the
        implementation's terms (default `case.features()`); `need` what the test asks besides (lse, grads)."""
        needed = (case.features() if requirements is None else set(requirements)) | set(need)
        declares = "does not declare" if self.expressible is not None else None   # a kernel in a calling convention
        missing = sorted(needed - self.capabilities())
        if missing:
            return f"{self.name} {declares or 'lacks'} {', '.join(missing)}"
        if case.dtype not in self.dtypes:
            return f"{self.name} {declares or 'does not run'} {case.dtype}"
        return self.within_limits(case, need)

    def within_limits(self, case: Any, need: frozenset[str] | set[str] = frozenset()) -> Literal[True] | str:
        """The declared limits: head dims (a maximum or a list), the longest sequence, and the contract's
        length limits and representations (`need` says whether gradients are wanted)."""
        if self.max_head_dim is None and self.head_dims is None and self.max_seqlen is None and self.contract is None:
            return True
        s = case.shape
        if self.max_head_dim is not None and max(s["Dk"], s["Dv"]) > self.max_head_dim:
            return f"{self.name} supports head dim <= {self.max_head_dim}"
        if self.head_dims is not None and not {s["Dk"], s["Dv"]} <= set(self.head_dims):
            return f"{self.name} runs head dims {list(self.head_dims)} only"
        if self.max_seqlen is not None and max(s["Lq"], s["Lk"]) > self.max_seqlen:
            return f"{self.name} runs sequences up to {self.max_seqlen} only"
        refused = self.contract.refusal(case, frozenset(need)) if self.contract is not None else None
        return f"{self.name}: {refused}" if refused else True

    # ---- what a run file records ------------------------------------------------------------
    def limits(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.head_dims is not None:
            out["head_dims"] = list(self.head_dims)
        elif self.max_head_dim is not None:
            out["head_dims"] = {"max": self.max_head_dim}
        if self.max_seqlen is not None:
            out["max_seqlen"] = self.max_seqlen
        return out

    def not_covered(self) -> list[str]:
        """Features the convention (or, for a built-in, the spec) could express that this scope leaves out."""
        return sorted((CAPABILITIES if self.expressible is None else self.expressible)
                      - self.capabilities() - {"grads", "dropout"})

    def as_dict(self) -> dict[str, Any]:
        """The scope in the words of a declaration (what `Adapter.scope()` returns and the run file keeps)."""
        contract = {"contract": self.contract.as_dict()} if self.contract is not None else {}
        return {**contract, "convention": self.convention or None, "source": self.source,
                "dtypes": self.ordered_dtypes(), "grads": self.grads, "dropout": self.dropout,
                "features": sorted(self.features), "limits": self.limits(), "not_covered": self.not_covered(),
                "outside_convention": list(self.outside), "deterministic": self.deterministic}

    # ---- the certificate's words ----------------------------------------------------------
    def words(self) -> tuple[str, str]:
        """(what is certified, what is not covered) in plain words: "float16/bfloat16, forward only, ...",
        "float64, float32, gradients, ...; outside the flash_attn convention: ..." ("nothing" if nothing)."""
        parts = ["/".join(self.ordered_dtypes()) or "no dtype", "forward and gradients" if self.grads else "forward only",
                 "dropout" if self.dropout else "no dropout"]
        parts += [FEATURE_WORDS.get(f, f) for f in sorted(self.features)]
        if self.head_dims is not None:
            parts.append("head dims " + "/".join(map(str, self.head_dims)))
        elif self.max_head_dim is not None:
            parts.append(f"head dim <= {self.max_head_dim}")
        if self.max_seqlen:
            parts.append(f"sequences up to {self.max_seqlen}")
        if not self.deterministic:
            parts.append("declared nondeterministic (reruns not required to be bitwise equal; their spread is recorded)")
        missing = [d for d in DTYPES if d not in self.dtypes] + ([] if self.grads else ["gradients"])
        missing += [FEATURE_WORDS.get(f, f) for f in self.not_covered()]
        text = ", ".join(missing) or "nothing"
        if self.outside:
            text += f"; outside the {self.convention or 'calling'} convention: " + ", ".join(self.outside)
        return ", ".join(parts), text

    def sentence(self) -> str:
        """One sentence for a certificate: "certified for ...; not covered: ...; outside the ... convention: ..."."""
        certified, missing = self.words()
        return f"certified for {certified}; not covered: {missing}"


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
        bad = [n for n in names if n not in DTYPES]
        if bad:
            raise ScopeError(f"{source}: unknown dtype(s) {', '.join(bad)}; known: {', '.join(DTYPES)}")
        if not names:
            raise ScopeError(f"{source}: 'dtypes' is empty: a kernel that runs no dtype cannot be certified")
        outside = [n for n in names if n not in full.dtypes]
        if outside:
            raise ScopeError(f"{source}: the {convention} convention does not run {', '.join(outside)}")
        dtypes = tuple(d for d in DTYPES if d in names)

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


def scope_sentence(scope: dict[str, Any]) -> str:
    """The certificate's sentence for a recorded scope (`Adapter.scope()`, a run file's `scopes` entry)."""
    return Scope.from_record(scope).sentence()
