"""A kernel's contract beyond its features: the behaviour it documents and the limits it states.

Declared beside the scope (adapters/scope.py), in the same dict or TOML file:

    empty_rows = "nan" | "zero" | "mean_of_values"   # the output of a row that sees no key
    compute_dtype = "bfloat16" | "float16" | "float32" # the precision it computes in, whatever the input
    scale_rounding = "input_dtype"                    # the scale is rounded to the input dtype first
    seqlen_multiple = 64            # or {q = 128, k = 64}: Lq, Lk multiples
    causal_equal_lengths = true     # causal only with Lq == Lk
    grads_seqlen_multiple = 128     # gradients only when Lq and Lk are multiples
    unsupported_raises = ["ValueError"]   # exception types (by name) that mean "not supported"
    representations = ["contiguous", "paged"]   # which of the convention's representations it takes
    [[when]]                        # limits that hold only under conditions (causal, grads, dtype)
    causal = false
    seqlen_multiple = {q = 128}

A behaviour becomes a divergence entry owned by the kernel (conformance/engine/declared.py): checked in
its region, the rest of each case judged as usual. A limit makes the cases outside it unsupported,
with a refusal that names the limit; generation fits cases into the limits (`fit_lengths`,
conformance/engine/scope_fit.py). Data and arithmetic only: it imports nothing of the suite but the dtype names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from attnconf.spec.vocabulary import DTYPES, LAYOUTS

BEHAVIOURS = {"empty_rows": ("nan", "zero", "mean_of_values"),
              "compute_dtype": ("bfloat16", "float16", "float32"),
              "scale_rounding": ("input_dtype",)}
LIMIT_KEYS = ("seqlen_multiple", "causal_equal_lengths", "grads_seqlen_multiple")
CONTRACT_KEYS = tuple(BEHAVIOURS) + LIMIT_KEYS + ("unsupported_raises", "representations", "when")
CONDITIONS = ("causal", "grads", "dtype")
# the representations a convention can hand a kernel; "contiguous" is the plain one everywhere
REPRESENTATIONS = {
    "flash_attn_kvcache": ("contiguous", "cache_batch_idx", "paged", "page_size_256", "page_size_512"),
    "flashinfer_prefill": ("NHD", "HND", "contiguous", "noncontiguous"),
    "flashinfer_decode": ("NHD", "HND", "contiguous", "noncontiguous"),
}
ALIASES = {"block_table": "paged"}


class ContractError(ValueError):
    """A malformed contract key (adapters/scope.py re-raises it as a ScopeError)."""


@dataclass(frozen=True)
class Limit:
    """Length limits that hold when every condition of `when` holds (an empty `when`: always)."""

    when: tuple[tuple[str, Any], ...] = ()
    q_multiple: int = 1
    k_multiple: int = 1
    grads_multiple: int = 1
    equal_when_causal: bool = False

    def applies(self, *, causal: bool | None, grads: bool | None, dtype: str | None) -> bool:
        """Whether the conditions hold; a condition on an unknown (None) value counts as holding."""
        have = {"causal": causal, "grads": grads, "dtype": dtype}
        for key, want in self.when:
            value = have[key]
            if value is None:
                continue
            if key == "dtype" and value not in want or key != "dtype" and value != want:
                return False
        return True

    def words(self) -> str:
        parts = []
        if self.q_multiple > 1 or self.k_multiple > 1:
            parts.append(f"Lq and Lk multiples of {self.q_multiple}" if self.q_multiple == self.k_multiple else
                         f"Lq a multiple of {self.q_multiple}" if self.k_multiple == 1 else
                         f"Lk a multiple of {self.k_multiple}" if self.q_multiple == 1 else
                         f"Lq a multiple of {self.q_multiple} and Lk of {self.k_multiple}")
        if self.grads_multiple > 1:
            parts.append(f"gradients only with Lq and Lk multiples of {self.grads_multiple}")
        if self.equal_when_causal:
            parts.append("causal only with Lq == Lk")
        cond = ", ".join(f"{k} = {'/'.join(v) if k == 'dtype' else str(v).lower()}" for k, v in self.when)
        return "; ".join(parts) + (f" (when {cond})" if cond else "")


@dataclass(frozen=True)
class Contract:
    behaviours: dict[str, str] = field(default_factory=dict)
    limits: tuple[Limit, ...] = ()
    unsupported_raises: tuple[str, ...] = ()
    representations: frozenset[str] | None = None
    source: str = ""

    # ---- limits ----------------------------------------------------------------------------
    def refusal(self, case, need: frozenset[str] | set[str] = frozenset()) -> str | None:
        """Why `case` lies outside the declared limits or representations (None if it does not)."""
        s = case.shape
        lq, lk = s["Lq"], s["Lk"]
        causal, grads = case.causal is not None, "grads" in need
        for lim in self.limits:
            if not lim.applies(causal=causal, grads=grads, dtype=case.dtype):
                continue
            bad = (lq % lim.q_multiple or lk % lim.k_multiple or (grads and (lq % lim.grads_multiple
                                                                             or lk % lim.grads_multiple))
                   or (causal and lim.equal_when_causal and lq != lk))
            if bad:
                return f"declared limit ({self.source}): {lim.words()}; this case has Lq={lq}, Lk={lk}" + \
                       (", causal" if causal else "") + (", gradients" if grads else "")
        return self.representation_refusal(case)

    def representation_refusal(self, case) -> str | None:
        """Why the representation a case names (its layout, its packing) is one the kernel does not take."""
        if self.representations is None:
            return None
        p, refused = case.packing, []
        if case.layout != "contiguous" and case.layout not in self.representations:
            refused.append(case.layout)
        page = p.get("page_size")
        if page and not (self.takes("paged") or f"page_size_{page}" in self.representations):
            refused.append(f"page_size_{page}")
        if page == 0 and not self.takes("contiguous"):
            refused.append("contiguous")
        if p.get("cache_batch_idx") and not self.takes("cache_batch_idx"):
            refused.append("cache_batch_idx")
        if p.get("kv_layout") and not self.takes(p["kv_layout"]):
            refused.append(p["kv_layout"])
        if refused:
            return (f"declared representations ({self.source}) are {', '.join(sorted(self.representations))}; "
                    f"this case uses {', '.join(refused)}")
        return None

    def takes(self, name: str) -> bool:
        """Whether the kernel takes a representation (every one, when none is declared)."""
        return self.representations is None or name in self.representations

    def page_sizes(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if self.representations is None or "paged" in self.representations:
            return sizes
        return tuple(n for n in sizes if f"page_size_{n}" in self.representations)

    def fit_lengths(self, lq: int, lk: int, *, causal: bool | None, grads: bool | None, dtype: str | None,
                    cap: int | None = None, equal: bool = False) -> tuple[int, int]:
        """(Lq, Lk) moved into the limits that apply: equal under causal (the shorter), then each rounded
        up to its multiples (down where rounding up passes `cap`); `equal` keeps equal lengths equal."""
        active = [lim for lim in self.limits if lim.applies(causal=causal, grads=grads, dtype=dtype)]
        if causal and any(lim.equal_when_causal for lim in active):
            lq = lk = min(lq, lk)
        mq = mk = 1
        for lim in active:
            mq, mk = math.lcm(mq, lim.q_multiple), math.lcm(mk, lim.k_multiple)
            if grads:
                mq, mk = math.lcm(mq, lim.grads_multiple), math.lcm(mk, lim.grads_multiple)
        if equal or causal and any(lim.equal_when_causal for lim in active):
            mq = mk = math.lcm(mq, mk)
        return _round(lq, mq, cap), _round(lk, mk, cap)

    # ---- exceptions ------------------------------------------------------------------------
    def refuses(self, exc: BaseException) -> bool:
        """Whether `exc` is one of the declared "not supported" exception types (by class name, bare or
        qualified with its module, the class or any base)."""
        names = set(self.unsupported_raises)
        return any(c.__name__ in names or f"{c.__module__}.{c.__qualname__}" in names for c in type(exc).__mro__)

    # ---- words -------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """The contract in the declaration's words (for the run file and the certificate)."""
        out: dict[str, Any] = dict(self.behaviours)
        if self.limits:
            out["limits"] = [lim.words() for lim in self.limits]
        if self.unsupported_raises:
            out["unsupported_raises"] = list(self.unsupported_raises)
        if self.representations is not None:
            out["representations"] = sorted(self.representations)
        return out


def _round(n: int, m: int, cap: int | None) -> int:
    if m <= 1 or n % m == 0:
        return n
    up = -(-n // m) * m
    if cap is not None and up > cap:
        down = (n // m) * m
        return down if down > 0 else up
    return up


def is_refusal(adapter: Any, exc: BaseException) -> bool:
    """A NotImplementedError, or an exception the adapter's contract declares to mean "not supported"."""
    if isinstance(exc, NotImplementedError):
        return True
    contract = getattr(adapter, "contract", None)
    return contract is not None and contract.refuses(exc)


# ---- parsing ----------------------------------------------------------------------------------
def _multiple(value: Any, key: str, where: str) -> tuple[int, int]:
    """(q multiple, k multiple) from N or {q = N, k = M}."""
    def positive(v: Any, what: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ContractError(f"{where}{what!r} must be a positive integer; got {v!r}")
        return v

    if isinstance(value, dict):
        extra = set(value) - {"q", "k"}
        if extra or not value:
            raise ContractError(f"{where}{key!r} as a table takes q and/or k; got {', '.join(map(str, value)) or 'nothing'}")
        return positive(value.get("q", 1), f"{key}.q"), positive(value.get("k", 1), f"{key}.k")
    n = positive(value, key)
    return n, n


def _limit(decl: dict[str, Any], when: tuple, where: str) -> Limit | None:
    q = k = g = 1
    equal = False
    if "seqlen_multiple" in decl:
        q, k = _multiple(decl["seqlen_multiple"], "seqlen_multiple", where)
    if "grads_seqlen_multiple" in decl:
        g, g2 = _multiple(decl["grads_seqlen_multiple"], "grads_seqlen_multiple", where)
        if g != g2:
            raise ContractError(f"{where}'grads_seqlen_multiple' is one integer N (Lq and Lk multiples of N)")
    if "causal_equal_lengths" in decl:
        equal = decl["causal_equal_lengths"]
        if not isinstance(equal, bool):
            raise ContractError(f"{where}'causal_equal_lengths' must be true or false; got {equal!r}")
    if (q, k, g, equal) == (1, 1, 1, False):
        return None
    return Limit(when, q, k, g, equal)


def _when(table: Any, i: int) -> tuple[tuple, dict[str, Any]]:
    where = f"when[{i}]: "
    if not isinstance(table, dict):
        raise ContractError(f"{where}each [[when]] is a table of conditions ({', '.join(CONDITIONS)}) and limits "
                            f"({', '.join(LIMIT_KEYS)}); got {table!r}")
    unknown = sorted(set(table) - set(CONDITIONS) - set(LIMIT_KEYS))
    if unknown:
        raise ContractError(f"{where}unknown key(s) {', '.join(unknown)}; conditions: {', '.join(CONDITIONS)}; "
                            f"limits: {', '.join(LIMIT_KEYS)}")
    cond = []
    for key in CONDITIONS:
        if key not in table:
            continue
        v = table[key]
        if key == "dtype":
            names = [v] if isinstance(v, str) else v
            if not isinstance(names, list) or not names or any(n not in DTYPES for n in names):
                raise ContractError(f"{where}'dtype' must be a dtype name or a list of them ({', '.join(DTYPES)}); "
                                    f"got {v!r}")
            cond.append((key, tuple(names)))
        elif not isinstance(v, bool):
            raise ContractError(f"{where}{key!r} must be true or false; got {v!r}")
        else:
            cond.append((key, v))
    if not cond:
        raise ContractError(f"{where}names no condition ({', '.join(CONDITIONS)}): put unconditional limits at top level")
    return tuple(cond), {k: v for k, v in table.items() if k in LIMIT_KEYS}


def parse(decl: dict[str, Any], *, source: str, convention: str) -> Contract | None:
    """The contract keys of a declaration (None if it has none); ContractError names the key."""
    if not any(k in decl for k in CONTRACT_KEYS):
        return None
    behaviours = {}
    for key, allowed in BEHAVIOURS.items():
        if key in decl:
            if decl[key] not in allowed:
                raise ContractError(f"{key!r} must be one of {', '.join(map(repr, allowed))}; got {decl[key]!r}")
            behaviours[key] = decl[key]
    limits = []
    top = _limit(decl, (), "")
    if top is not None:
        limits.append(top)
    whens = decl.get("when", [])
    if isinstance(whens, dict):
        whens = [whens]
    if not isinstance(whens, list):
        raise ContractError(f"'when' must be a list of tables ([[when]]); got {whens!r}")
    for i, table in enumerate(whens):
        cond, keys = _when(table, i)
        lim = _limit(keys, cond, f"when[{i}]: ")
        if lim is None:
            raise ContractError(f"when[{i}]: states no limit ({', '.join(LIMIT_KEYS)})")
        limits.append(lim)
    raises = decl.get("unsupported_raises", [])
    if isinstance(raises, str) or not isinstance(raises, list) or not all(isinstance(n, str) and n for n in raises):
        raise ContractError(f"'unsupported_raises' must be a list of exception type names; got {raises!r}")
    reps = None
    if "representations" in decl:
        names = decl["representations"]
        known = REPRESENTATIONS.get(convention, LAYOUTS)
        if isinstance(names, str) or not isinstance(names, list) or not names:
            raise ContractError(f"'representations' must be a non-empty list of names ({', '.join(known)}); got {names!r}")
        names = [ALIASES.get(n, n) for n in names]
        bad = [n for n in names if n not in known]
        if bad:
            raise ContractError(f"unknown representation(s) {', '.join(map(str, bad))} for the {convention} convention; "
                                f"known: {', '.join(known)}")
        reps = frozenset(names)
    return Contract(behaviours, tuple(limits), tuple(raises), reps, source)
