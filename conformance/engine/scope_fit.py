"""Fit a generated case to an implementation's declared scope.

Hypothesis draws cases before it knows which implementation runs them, so a
strategy rich in features (windows, softcap, ALiBi, padding, masks) would leave a
narrow kernel (a flash-attention convention, a float16-only kernel) with mostly
unsupported examples. `fit(case, impl)` projects the case onto the scope instead:
it turns off, one at a time and in a fixed order, what the implementation does
not declare (a feature, the dtype, a head dim beyond its limit, a second query
for a decode kernel), and returns the first variant `impl.supports` accepts, or
None. The projection is deterministic and idempotent (a supported case comes back
unchanged), so a saved failing case replays as itself. What the scope is (its dtypes,
limits and contract) is read from the one `Scope` (adapters/scope.py), and whether a
variant fits is `impl.supports`, which asks that Scope.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from attnconf.adapters.scope import Scope
from attnconf.reference import Case
from attnconf.reference.attention import expand_kv
from attnconf.conformance.strategies import offer



def _cut_kv(case: Case, lk: int) -> dict:
    """Changes that keep only the first lk keys (mask, bias and lengths cut to match)."""
    ch = {"k": case.k[:, :, :lk], "v": case.v[:, :, :lk]}
    for name in ("mask", "bias"):
        x = getattr(case, name)
        if x is not None and x.shape[-1] == case.shape["Lk"] and x.shape[-1] != lk:
            ch[name] = x[..., :lk]
    if case.kv_lengths is not None:
        ch["kv_lengths"] = np.minimum(case.kv_lengths, lk)
    return ch


def _cut_q(case: Case, rows: slice) -> dict:
    """Changes that keep only some query rows."""
    lq = case.shape["Lq"]
    ch = {"q": case.q[:, :, rows]}
    n = ch["q"].shape[2]
    for name in ("mask", "bias"):
        x = getattr(case, name)
        if x is not None and x.ndim >= 2 and x.shape[-2] == lq and lq != 1:
            ch[name] = x[..., rows, :]
    if case.grad_out is not None:
        ch["grad_out"] = case.grad_out[:, :, rows]
    if case.q_lengths is not None:
        ch["q_lengths"] = np.minimum(case.q_lengths, n)
    return ch


def _grow(case: Case, lq: int, lk: int) -> dict:
    """Changes that lengthen the case to lq queries and lk keys: new rows and keys drawn from the case seed,
    visible through the mask (True) and the bias (0); the declared lengths (padding) stay as they were."""
    s = case.shape
    rng = np.random.default_rng([case.seed, 41])
    ch: dict = {}

    def more(x: np.ndarray, axis: int, n: int, fill=None) -> np.ndarray:
        shape = list(x.shape)
        shape[axis] = n
        extra = rng.normal(size=shape) if fill is None else np.full(shape, fill, dtype=x.dtype)
        return np.concatenate([x, extra], axis=axis)

    if lk > s["Lk"]:
        ch["k"], ch["v"] = more(case.k, 2, lk - s["Lk"]), more(case.v, 2, lk - s["Lk"])
    if lq > s["Lq"]:
        ch["q"] = more(case.q, 2, lq - s["Lq"])
        if case.grad_out is not None:
            ch["grad_out"] = more(case.grad_out, 2, lq - s["Lq"])
    for name, fill in (("mask", True), ("bias", 0.0)):
        x = getattr(case, name)
        if x is None:
            continue
        if lk > s["Lk"] and x.shape[-1] == s["Lk"] and s["Lk"] != 1:
            x = more(x, x.ndim - 1, lk - s["Lk"], fill)
        if lq > s["Lq"] and x.ndim >= 2 and x.shape[-2] == s["Lq"] and s["Lq"] != 1:
            x = more(x, x.ndim - 2, lq - s["Lq"], fill)
        ch[name] = x
    return ch


def declared_lengths(case: Case, impl, need: frozenset[str]) -> Case:
    """The case inside the implementation's declared length limits (itself if it is, or cannot be)."""
    return _declared_lengths(case, impl, need) or case


def _declared_lengths(case: Case, impl, need: frozenset[str]) -> Case | None:
    """The case moved into the contract's length limits (adapters/contract.py): lengths cut to equal where
    causal asks it, then grown to the declared multiples."""
    scope = Scope.of(impl)
    contract = scope.contract
    if contract is None or not contract.limits:
        return None
    s = case.shape
    lq, lk = contract.fit_lengths(s["Lq"], s["Lk"], causal=case.causal is not None, grads="grads" in need,
                                  dtype=case.dtype, cap=scope.max_seqlen, equal=s["Lq"] == s["Lk"] and not scope.allows("cross"))
    if (lq, lk) == (s["Lq"], s["Lk"]):
        return None
    c = case
    if lk < s["Lk"]:
        c = _apply(c, _cut_kv(c, lk)) or c
    if lq < s["Lq"]:
        c = _apply(c, _cut_q(c, slice(0, lq))) or c
    return _apply(c, _grow(c, lq, lk)) if (lq, lk) != (c.shape["Lq"], c.shape["Lk"]) else c


def _same_lengths(case: Case) -> dict:
    """Lq == Lk by cutting the longer side."""
    lq, lk = case.shape["Lq"], case.shape["Lk"]
    if lq > lk:
        return _cut_q(case, slice(0, lk))
    return _cut_kv(case, lq)


def _no_gqa(case: Case) -> dict:
    hq = case.shape["Hq"]
    return {"k": expand_kv(case.k, hq), "v": expand_kv(case.v, hq)}


def _same_dv(case: Case) -> dict:
    s = case.shape
    dk, dv = s["Dk"], s["Dv"]
    if dv > dk:
        v = case.v[..., :dk]
    else:
        pad = np.random.default_rng(case.seed + 17).normal(size=case.v.shape[:-1] + (dk - dv,))
        v = np.concatenate([case.v, pad], axis=-1)
    ch = {"v": v}
    if case.grad_out is not None:
        g = case.grad_out
        ch["grad_out"] = g[..., :dk] if dv > dk else np.concatenate([g, np.zeros(g.shape[:-1] + (dk - dv,))], -1)
    return ch


def _head_dim(case: Case, d: int) -> dict:
    """Every head dim set to d (cut, or padded with draws from the case seed)."""
    rng = np.random.default_rng(case.seed + 19)
    ch = {}
    for name in ("q", "k", "v", "grad_out"):
        x = getattr(case, name)
        if x is None:
            continue
        if x.shape[-1] >= d:
            ch[name] = x[..., :d]
        else:
            ch[name] = np.concatenate([x, rng.normal(size=x.shape[:-1] + (d - x.shape[-1],))], -1)
    return ch


def _mask_shared_over_heads(case: Case) -> dict:
    m = case.mask
    if m is None or m.ndim < 3:
        return {}
    full = np.broadcast_to(m, np.broadcast_shapes(m.shape, (1, 1, 1, 1)))
    return {"mask": full[:, :1] if full.shape[1] > 1 else full}


def _window_left_only(case: Case) -> dict:
    if case.window is None or case.window[1] == -1:
        return {}
    return {"window": (case.window[0], -1) if case.window[0] >= 0 else None}


# (feature, changes): turned off in this order, each only when the implementation lacks it
REMOVERS: list[tuple[str, Callable[[Case], dict]]] = [
    ("dropout", lambda c: {"dropout_p": 0.0}),
    ("sinks", lambda c: {"sinks": None}),
    ("alibi", lambda c: {"alibi_slopes": None}),
    ("softcap", lambda c: {"softcap": None}),
    ("mask_with_causal", lambda c: {"mask": None, "bias": None}),
    ("bias", lambda c: {"bias": None}),
    ("mask", lambda c: {"mask": None}),
    ("q_lengths", lambda c: {"q_lengths": None}),
    ("kv_lengths", lambda c: {"kv_lengths": None}),
    ("causal_top_left", lambda c: {"causal": "bottom_right"}),
    ("causal_bottom_right", lambda c: {"causal": "top_left"}),
    ("window_top_left", lambda c: {"window_align": "bottom_right"}),
    ("window_bottom_right", lambda c: {"window_align": "top_left"}),
    ("noncontiguous", lambda c: {"layout": "contiguous"}),
    ("broadcast_kv", lambda c: {"layout": "contiguous"}),
    ("custom_scale", lambda c: {"scale": None}),
    ("gqa", _no_gqa),
    ("dv_ne_dk", _same_dv),
    ("cross", _same_lengths),
    ("paged", lambda c: {"packing": {k: v for k, v in c.packing.items() if k != "page_size"}}),
    ("kvcache_append", lambda c: {"packing": {k: v for k, v in c.packing.items() if k != "new_keys"}}),
]
# second resort for a feature whose first change did not help (an alignment the kernel lacks both of)
FALLBACK = {"causal_top_left": lambda c: {"causal": None}, "causal_bottom_right": lambda c: {"causal": None},
            "window_top_left": lambda c: {"window": None}, "window_bottom_right": lambda c: {"window": None}}
# what a convention cannot say beyond the feature names: tried in order when nothing else is missing
EXTRA: list[Callable[[Case], dict]] = [
    _mask_shared_over_heads,
    _window_left_only,
    lambda c: _cut_q(c, slice(c.shape["Lq"] - 1, None)) if c.shape["Lq"] > 1 else {},   # one query (decode)
    lambda c: {"window_align": "bottom_right"},
    lambda c: {} if c.alibi_slopes is None else {"alibi_slopes": c.alibi_slopes.astype(np.float32).astype(np.float64)},
    lambda c: {"packing": {}},
]


# the dtype a case takes instead of one the scope lacks: the nearest in precision, then in range
NEAREST_DTYPES = {"float64": ("float32", "bfloat16", "float16"), "float32": ("float64", "bfloat16", "float16"),
                  "float16": ("bfloat16", "float32", "float64"), "bfloat16": ("float16", "float32", "float64")}


def _apply(case: Case, changes: dict) -> Case | None:
    if not changes:
        return None
    try:
        return case.replace(**changes)
    except (ValueError, TypeError):
        return None


def _limits(case: Case, impl, need: frozenset[str] = frozenset()) -> Case | None:
    """The dtype and the declared head-dim and length limits."""
    s, scope = case.shape, Scope.of(impl)
    changed = case
    if case.dtype not in scope.dtypes:
        dtype = next((d for d in NEAREST_DTYPES[case.dtype] if d in scope.dtypes), None)
        if dtype is None:
            return None
        changed = _apply(changed, {"dtype": dtype}) or changed
    heads, cap = scope.head_dims, scope.max_head_dim
    d = max(s["Dk"], s["Dv"])
    if heads and not {s["Dk"], s["Dv"]} <= set(heads):
        fits = [h for h in heads if h <= d]
        changed = _apply(changed, _head_dim(changed, max(fits) if fits else min(heads))) or changed
    elif cap is not None and d > cap:
        changed = _apply(changed, _head_dim(changed, cap)) or changed
    longest = scope.max_seqlen
    if longest is not None and max(s["Lq"], s["Lk"]) > longest:
        c = _apply(changed, _cut_kv(changed, min(s["Lk"], longest)))
        changed = _apply(c or changed, _cut_q(c or changed, slice(0, min(s["Lq"], longest)))) or changed
    changed = _declared_lengths(changed, impl, need) or changed
    return None if changed is case else changed


def fit(case: Case, impl, *, need: Iterable[str] = (), record: bool = True) -> Case | None:
    """The case projected onto `impl`'s scope (itself if supported), or None if no variant is."""
    need = frozenset(need)
    if not Scope.of(impl).allows(*need):
        return None
    for _ in range(2 * len(REMOVERS) + len(EXTRA) + 4):
        if impl.supports(case, need=need) is True:
            if record and hasattr(impl, "record"):      # a harness Subject: remember the case a failure shows
                impl.record.current_case = case
            return case
        if case.sinks is None and "sinks" in getattr(impl, "requires", ()):
            # a kernel that always reads sink logits (gpt-oss's eager function) takes the case with zero sinks
            offer("sinks")
            with_sinks = _apply(case, {"sinks": np.zeros(case.shape["Hq"])})
            if with_sinks is not None and impl.supports(with_sinks, need=need) is True:
                case = with_sinks
                continue
        missing = set(impl.requirements(case)) - set(impl.capabilities)
        nxt = None
        for feature, change in REMOVERS:
            if feature in missing:
                nxt = _apply(case, change(case))
                if nxt is not None and feature in set(impl.requirements(nxt)) - set(impl.capabilities):
                    nxt = _apply(case, FALLBACK[feature](case)) if feature in FALLBACK else nxt
                if nxt is not None:
                    break
        if nxt is None:
            nxt = _limits(case, impl, need)
        if nxt is None:
            reason = impl.supports(case, need=need)
            for change in EXTRA:
                c = _apply(case, change(case))
                if c is not None and impl.supports(c, need=need) != reason:
                    nxt = c
                    break
        if nxt is None:
            return None
        case = nxt
    return None
