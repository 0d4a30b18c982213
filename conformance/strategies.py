"""Every Hypothesis strategy of the suite: cases that reach the corners where kernels break.

Shapes, masks, dtypes and value regimes are drawn by Hypothesis (so they
shrink); the array values come from a NumPy generator seeded by a drawn seed
(so they are cheap and a case replays from its seed). Sizes are bounded so
that one example costs milliseconds on a 2-core CPU: the product
B * Hq * Lq * Lk * (Dk + Dv) stays under BUDGET.

Generation happens inside a *cell*: the dtype of the pytest item being run and the
declared scope of the implementation under test (features, dtypes, head dims,
lengths), set by the harness with `cell(...)`. Every strategy draws its dtype with
`dtype_choice` and asks `allows(feature)` before it draws a feature, so cases stay
inside what the implementation declares (ATTN-SCOPE-1) and inside the cell's dtype.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterable, Iterator

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from attnconf.conformance import boundaries, palette
from attnconf.reference import DTYPES, Case

BUDGET = 1_500_000
# Lengths where tiled kernels break: 1, small primes, 2^k +- 1, = 1 mod 16/32/64/128, several blocks.
SMALL_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 17, 31, 32, 33)
MEDIUM_LENGTHS = (47, 63, 64, 65, 81, 97, 113, 127, 128, 129)
LARGE_LENGTHS = (193, 255, 257, 300, 385)
HEAD_DIMS = (8, 16, 4, 1, 2, 3, 5, 32, 40, 64, 72, 80, 96, 104, 128, 160, 200, 256)
GROUPS = (1, 2, 4, 8)
REGIMES = ("ordinary", "large", "overflow", "mixed", "near_ties", "large_values")
# short query blocks against a long history (speculative decoding, chunked prefill: split-KV paths)
SHORT_QUERIES, LONG_HISTORIES = (2, 4, 8, 16), (513, 1024)
FINITE_MAX = {"float64": 1e30, "float32": 1e30, "bfloat16": 1e30, "float16": 6e4}

# (dtype, scope) of the cell being generated for; (None, None) outside a run (everything allowed).
_CELL: ContextVar[tuple[str | None, dict[str, Any] | None]] = ContextVar("attnconf_cell", default=(None, None))


@contextlib.contextmanager
def cell(dtype: str | None, scope: dict[str, Any] | None) -> Iterator[None]:
    """Generate for one dtype and inside one declared scope (see the module docstring)."""
    token, seen = _CELL.set((dtype, scope)), _OFFERED.set(set())
    try:
        yield
    finally:
        _OFFERED.reset(seen)
        _CELL.reset(token)


# features an implementation may require of every case (Implementation.requires): the strategies that can
# add one say so through `offer`, so that a cell whose strategy never does is unsupported at once
REQUIRABLE = frozenset({"sinks"})
_OFFERED: ContextVar[set[str] | None] = ContextVar("attnconf_offered", default=None)


def offer(feature: str) -> None:
    """Note that the strategy drawing now could have given its case `feature` (a REQUIRABLE one)."""
    seen = _OFFERED.get()
    if seen is not None:
        seen.add(feature)


def offered() -> frozenset[str]:
    """The REQUIRABLE features the strategies of the current cell have offered so far."""
    return frozenset(_OFFERED.get() or ())


def allows(*features: str) -> bool:
    """Whether the implementation under test declares every one of `features`."""
    scope = _CELL.get()[1]
    return scope is None or all(f in scope["features"] for f in features)


@st.composite
def declared_choice(draw, options: dict[str, str]) -> str:
    """One of `options` (name -> the feature it needs) that the implementation declares, rejecting the draw
    if it declares none: a strategy that hides keys by a mask, a bias or lengths draws only the ways the
    kernel can take."""
    mine = tuple(name for name, feature in options.items() if allows(feature))
    if not mine:
        reject()
    return draw(st.sampled_from(mine))


def _limit(name: str):
    scope = _CELL.get()[1]
    return None if scope is None else scope.get(name)


@st.composite
def dtype_choice(draw, dtypes: tuple[str, ...] = DTYPES) -> str:
    """The cell's dtype (rejecting the example if this strategy cannot make it), or a drawn one."""
    fixed = _CELL.get()[0]
    if fixed is None:
        return draw(st.sampled_from(dtypes))
    if fixed not in dtypes:
        reject()
    return fixed


@st.composite
def fixed_cases(draw, pool: tuple[Case, ...] | list[Case]) -> Case:
    """One of the given fixed cases, of the cell's dtype (`pool` may be a function of that dtype)."""
    fixed = _CELL.get()[0]
    mine = [c for c in (pool(fixed) if callable(pool) else pool) if fixed is None or c.dtype == fixed]
    if not mine:
        reject()
    return draw(st.sampled_from(mine))


def dtypes_of(pool) -> tuple[str, ...]:
    """The dtypes a list of fixed cases covers, in the spec's order."""
    return tuple(d for d in DTYPES if any(c.dtype == d for c in pool))


def _head_dims() -> tuple[int, ...]:
    dims, cap = _limit("head_dims"), _limit("max_head_dim")
    pool = tuple(d for d in HEAD_DIMS if (dims is None or d in dims) and (cap is None or d <= cap))
    return pool or tuple(dims or (8,))


@st.composite
def lengths(draw, max_len: int = 385) -> int:
    cap = _limit("max_seqlen")
    max_len = max_len if cap is None else min(max_len, cap)
    pool = draw(st.sampled_from(("small", "small", "small", "medium", "large")))
    choices = {"small": SMALL_LENGTHS, "medium": MEDIUM_LENGTHS, "large": LARGE_LENGTHS}[pool]
    return draw(st.sampled_from([n for n in choices if n <= max_len] or [1]))


def fit_lengths(draw, lq: int, lk: int) -> tuple[int, int]:
    """(Lq, Lk) moved into the kernel's declared length limits (adapters/contract.py), rounded up to their
    multiples, so that a narrow kernel's cells fill with cases it takes. Limits conditioned on causal or
    gradients, unknown while shapes are drawn, apply as a drawn guess of either (the other half of the
    draws stays free, so the cases those limits do not bind keep every length)."""
    contract = _limit("contract")
    if contract is None or not contract.limits:
        return lq, lk
    causal, grads = draw(st.booleans()), draw(st.booleans())
    return contract.fit_lengths(lq, lk, causal=causal, grads=grads, dtype=_CELL.get()[0], cap=_limit("max_seqlen"),
                                equal=lq == lk and not allows("cross"))


def _palette(require=None, **switches):
    """conformance/palette.py's shapes that `switches` (gqa, cross, dv_ne_dk, max_len), `require` and the
    declared scope allow (None if none: the caller draws freely)."""
    return palette.palette_shapes(head_dims=_limit("head_dims"), max_seqlen=_limit("max_seqlen"),
                                  max_head_dim=_limit("max_head_dim"), require=require, **switches)


@st.composite
def _palette_family(draw, max_len: int, require) -> dict[str, int] | None:
    """On a compile-per-shape implementation, a palette shape of the family `require` accepts; else None
    (nothing drawn: the caller draws from `shapes()` and bends the shape into the family)."""
    if not _limit("palette"):
        return None
    return draw(_palette(gqa=allows("gqa"), cross=allows("cross"), dv_ne_dk=allows("dv_ne_dk"), max_len=max_len,
                         require=require))


@st.composite
def shapes(draw, *, gqa: bool = True, cross: bool = True, dv_ne_dk: bool = True, max_len: int = 385,
           same_d: bool = False) -> dict[str, int]:
    cross, gqa = cross and allows("cross"), gqa and allows("gqa")
    dv_ne_dk = dv_ne_dk and allows("dv_ne_dk")
    if draw(st.integers(0, 7)) == 0:           # a branch point of real kernels, past the size budget
        s = draw(boundaries.boundary_shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk and not same_d, max_len=max_len,
                                            head_dims=_limit("head_dims"), max_seqlen=_limit("max_seqlen"),
                                            max_head_dim=_limit("max_head_dim")))
        if s is not None:
            if _limit("kv_covers_q") and s["Lk"] < s["Lq"]:
                s["Lq"], s["Lk"] = s["Lk"], s["Lq"]
            return s
    if _limit("palette"):                      # a compile-per-shape implementation: reuse compiled shapes
        s = draw(_palette(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk and not same_d, max_len=max_len))
        if s is not None:
            if _limit("kv_covers_q") and s["Lk"] < s["Lq"]:
                s["Lq"], s["Lk"] = s["Lk"], s["Lq"]
            s["Lq"], s["Lk"] = fit_lengths(draw, s["Lq"], s["Lk"])
            return s
    lq = draw(lengths(max_len))
    lk = draw(lengths(max_len)) if cross and draw(st.booleans()) else lq
    cap = _limit("max_seqlen")
    if cross and max_len >= max(LARGE_LENGTHS) and draw(st.integers(0, 9)) == 0:
        longer = [n for n in LONG_HISTORIES if cap is None or n <= cap]
        if longer:
            lq, lk = draw(st.sampled_from(SHORT_QUERIES)), draw(st.sampled_from(longer))
    if _limit("kv_covers_q") and lk < lq:      # a kernel whose keys must cover its queries (e.g. a KV-cache op)
        lq, lk = lk, lq
    lq, lk = fit_lengths(draw, lq, lk)
    dk = draw(st.sampled_from(_head_dims()))
    dv = draw(st.sampled_from(_head_dims())) if dv_ne_dk and not same_d and draw(st.integers(0, 3)) == 0 else dk
    hkv = draw(st.sampled_from((1, 2, 1, 3, 8)))
    group = draw(st.sampled_from(GROUPS)) if gqa else 1
    b = draw(st.sampled_from((1, 2, 3)))
    hq = hkv * group
    while b * hq * lq * lk * (dk + dv) > BUDGET and (b > 1 or hq > 1):
        if b > 1:
            b -= 1
        elif hkv > 1:
            hkv -= 1
            hq = hkv * group
        else:
            group = max(1, group // 2)
            hq = hkv * group
    if b * hq * lq * lk * (dk + dv) > BUDGET:
        dk = dv = min(_head_dims(), key=lambda d: abs(d - 8))
    return {"B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dv}


def values(rng: np.random.Generator, s: dict[str, int], regime: str, dtype: str):
    """q, k, v (float64) for a value regime."""
    b, hq, hkv, lq, lk, dk, dv = (s[n] for n in ("B", "Hq", "Hkv", "Lq", "Lk", "Dk", "Dv"))
    q = rng.normal(size=(b, hq, lq, dk))
    k = rng.normal(size=(b, hkv, lk, dk))
    v = rng.normal(size=(b, hkv, lk, dv))
    if regime == "large":          # scaled logits up to about 1e4
        target = 10 ** rng.uniform(2.5, 3.5)
        a = np.sqrt(target)
        q, k = q * a, k * a
    elif regime == "overflow":     # logits ~ 50..200: exp() overflows fp16/bf16/fp32 without max-subtraction
        a = np.sqrt(rng.uniform(60, 200) / 1.0)
        q, k = q * a, k * a
    elif regime == "mixed":        # rows whose logit ranges differ by orders of magnitude
        q = q * 10.0 ** rng.uniform(-3, 2, size=(b, hq, lq, 1))
    elif regime == "near_ties":    # nearly identical keys and a sharp query: near-equal top logits
        k = k[:, :, :1, :] + 1e-3 * rng.normal(size=k.shape)
        q = q * 10.0
    elif regime == "large_values" and dtype != "float16":
        # outputs far from O(1), past float16's range (65504): a bfloat16 or float32 result stored through a
        # float16 buffer overflows. Not in float16 itself, whose range leaves no room: the baseline's own
        # dO V^T (and a correct kernel's dbias) would overflow there.
        v = v * 10.0 ** rng.uniform(4.5, 6.0)
    if dtype == "float16":         # keep q * scale and logits inside fp16's range
        q = np.clip(q, -3e4, 3e4)
    return q, k, v


@st.composite
def mask_params(draw, rng: np.random.Generator, s: dict[str, int], *, causal: bool = True, masks: bool = True,
                padding: bool = True, bias: bool = True, empty_rows: bool = True) -> dict:
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    p: dict = {}
    alignments = tuple(a for a in ("top_left", "bottom_right") if allows("causal_" + a))
    if lq != lk and not allows("cross"):
        alignments = ()
    if causal and alignments:
        p["causal"] = draw(st.sampled_from((None, None) + alignments))
    masks, bias = masks and allows("mask"), bias and allows("bias")
    if p.get("causal") and not allows("mask_with_causal"):
        masks = bias = False
    if masks and draw(st.integers(0, 2)) == 0:
        density = draw(st.sampled_from((0.5, 0.9, 0.1)))
        mshape = draw(st.sampled_from(((b, 1, lq, lk), (1, 1, lq, lk), (b, hq, lq, lk), (lq, lk), (b, 1, 1, lk),
                                       (lk,))))
        m = rng.random(mshape) < density
        if empty_rows and len(mshape) >= 2 and mshape[-2] == lq and draw(st.integers(0, 3)) == 0:
            m[..., int(rng.integers(lq)), :] = False     # a fully-masked row
        p["mask"] = m
    if bias and draw(st.integers(0, 3)) == 0:
        bshape = draw(st.sampled_from(((b, hq, lq, lk), (1, hq, lq, lk), (b, 1, lq, lk), (lq, lk))))
        bias_ = rng.normal(size=bshape) * draw(st.sampled_from((1.0, 3.0)))
        if draw(st.booleans()):
            bias_[rng.random(bshape) < 0.2] = -np.inf
        p["bias"] = bias_
    if padding and allows("kv_lengths") and draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(0 if empty_rows else 1, lk + 1, size=b)
        if allows("q_lengths") and draw(st.booleans()):
            p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
        if _limit("kv_covers_q"):
            p["kv_lengths"] = np.minimum(np.maximum(p["kv_lengths"], p.get("q_lengths", np.full(b, lq))), lk)
    elif padding and allows("q_lengths") and draw(st.integers(0, 5)) == 0:
        # query padding alone: keys past a sequence's query length stay visible (a kernel that masks them
        # with q_lengths where no kv_lengths were given is wrong)
        p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
    return p


@st.composite
def cases(draw, *, dtypes: tuple[str, ...] = DTYPES, regimes: tuple[str, ...] = REGIMES, causal: bool = True,
          masks: bool = True, padding: bool = True, bias: bool = True, empty_rows: bool = True, gqa: bool = True,
          cross: bool = True, dv_ne_dk: bool = True, same_d: bool = False, custom_scale: bool = True,
          layouts: bool = True, grad: bool = False, max_len: int = 385, sinks: bool = False) -> Case:
    """A validated Case anywhere in the spec's domain (restrict with the keyword switches). `sinks`: one case
    in four gets per-head sinks where the implementation declares them (the properties hold with sinks)."""
    s = draw(shapes(gqa=gqa, cross=cross, dv_ne_dk=dv_ne_dk, max_len=max_len, same_d=same_d))
    dtype = draw(dtype_choice(dtypes))
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    params = draw(mask_params(rng, s, causal=causal, masks=masks, padding=padding, bias=bias, empty_rows=empty_rows))
    if custom_scale and allows("custom_scale") and draw(st.integers(0, 4)) == 0:
        params["scale"] = draw(st.sampled_from((0.5, 1.0, 0.125, 2.0, 0.01, 0.0)))   # 0: every visible key alike
    layout = "contiguous"
    if layouts:
        layout = draw(st.sampled_from(("contiguous", "contiguous", "contiguous")
                                      + tuple(x for x in ("noncontiguous", "broadcast_kv") if allows(x))))
        if layout == "broadcast_kv":
            k = np.broadcast_to(k[:1], k.shape).copy()
            v = np.broadcast_to(v[:1], v.shape).copy()
    if grad:
        params["grad_out"] = rng.normal(size=(s["B"], s["Hq"], s["Lq"], s["Dv"]))
    case = Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **params)
    if sinks and allows("sinks") and draw(st.integers(0, 3)) == 0:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


def visible_rows_only(case: Case) -> bool:
    """Every query row sees at least one key."""
    from attnconf.reference import oracle

    return bool(oracle(case).visible.any(axis=-1).all())


def fixed_case(seed: int = 0, *, B=1, Hq=2, Hkv=None, Lq=5, Lk=7, Dk=8, Dv=None, dtype="float32", **params) -> Case:
    """A small deterministic case for @example pins and witnesses."""
    rng = np.random.default_rng(seed)
    s = {"B": B, "Hq": Hq, "Hkv": Hkv or Hq, "Lq": Lq, "Lk": Lk, "Dk": Dk, "Dv": Dv or Dk}
    q, k, v = values(rng, s, params.pop("regime", "ordinary"), dtype)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **params)


# ---- pinned cases: one per way kernels break -------------------------------------------------------
# Keyword arguments of `fixed_case`. The agreement tests run them as explicit examples in their own
# dtype; conformance/test_first_look.py runs all of them in every dtype before any other test, so
# that most bugs show in the first second of a run.
AGREEMENT_PINS: tuple[dict[str, Any], ...] = (
    dict(seed=1, Lq=1, Lk=1, Dk=1),
    dict(seed=2, B=2, Hq=4, Hkv=1, Lq=17, Lk=33, Dk=40, Dv=24, causal="bottom_right"),
    dict(seed=3, Lq=9, Lk=4, Dk=16, causal="bottom_right", dtype="float16"),
    dict(seed=4, Lq=129, Lk=65, Dk=64, dtype="bfloat16", regime="large"),
    dict(seed=5, Lq=8, Lk=8, dtype="float64", kv_lengths=[3], q_lengths=[6]),
    dict(seed=6, Hq=2, Lq=5, Lk=11, Dk=16, causal="bottom_right"),
    dict(seed=7, B=2, Lq=6, Lk=9, Dk=16, mask=np.random.default_rng(7).random((2, 1, 1, 9)) < 0.5),
    dict(seed=8, Lq=7, Lk=7, Dk=16, causal="top_left", dtype="float64"),
    dict(seed=9, B=2, Hq=2, Lq=5, Lk=9, Dk=16, causal="top_left"),
    dict(seed=10, Hq=2, Lq=9, Lk=5, Dk=8, causal="top_left", dtype="float64"),
    dict(seed=11, Hq=2, Lq=6, Lk=7, Dk=16, Dv=8, scale=0.3),
    dict(seed=12, B=2, Hq=2, Lq=6, Lk=8, Dk=16, bias=2.0 * np.random.default_rng(12).standard_normal((2, 1, 6, 8))),
    dict(seed=13, Hq=1, Lq=5, Lk=257, Dk=256),                 # a wide head over several key blocks
    dict(seed=14, Hq=16, Hkv=8, Lq=3, Lk=9, Dk=8),             # more than four KV heads, in pairs
    dict(seed=15, Hq=2, Lq=4, Lk=1024, Dk=32),                 # a short query block over a long history
    dict(seed=16, Hq=2, Lq=3, Lk=6, Dk=8, scale=0.0),          # scale 0 is given, not the default
    dict(seed=17, Hq=2, Lq=16, Lk=200, Dk=256, regime="overflow"),  # a wide V head, row max rising in later blocks
    dict(seed=18, Hq=2, Lq=6, Lk=7, Dk=16, scale=-0.5),        # a negative scale over several keys
    dict(seed=19, Hq=1, Lq=530, Lk=530, Dk=8, causal="top_left"),   # causal past 512 query rows
    dict(seed=20, B=5, Hq=1, Lq=4, Lk=6, Dk=8, mask=np.random.default_rng(20).random((5, 1, 4, 6)) < 0.5),  # B > 4
    dict(seed=21, B=2, Hq=2, Lq=5, Lk=6, Dk=8, mask=np.random.default_rng(21).random((2, 5, 6)) < 0.5),  # 3-D: (Hq, ., .)
)
# for the calling conventions of modern kernels; `scope_fit.fit` adapts each to the kernel's scope
# (a decode kernel gets its last query row, a flash-attention kernel loses the mask, ...)
CONVENTION_PINS: tuple[dict[str, Any], ...] = (
    dict(seed=61, B=2, Hq=4, Hkv=2, Lq=5, Lk=11, Dk=16, window=(2, 1), causal="bottom_right"),
    dict(seed=62, B=1, Hq=2, Lq=9, Lk=9, Dk=8, window=(1, 2)),
    dict(seed=63, B=2, Hq=2, Lq=7, Lk=4, Dk=16, window=(0, 2)),                  # rows with no key
    dict(seed=64, B=1, Hq=4, Hkv=1, Lq=6, Lk=6, Dk=32, softcap=1.0, regime="large", causal="bottom_right"),
    dict(seed=65, B=2, Hq=4, Lq=6, Lk=13, Dk=16, alibi_slopes=np.array([1.0, 0.5, 0.25, 0.125])),
    dict(seed=66, B=2, Hq=2, Lq=13, Lk=6, Dk=8, alibi_slopes=np.array([[0.3, 0.9], [1.5, 0.1]]),
         causal="bottom_right", softcap=5.0),
    dict(seed=67, B=3, Hq=4, Hkv=2, Lq=7, Lk=9, Dk=8, q_lengths=[3, 7, 5], kv_lengths=[9, 2, 6],
         causal="bottom_right", packing={"seq_order": [0, 1, 2], "new_keys": 2, "page_size": 0}),
    dict(seed=68, B=2, Hq=2, Lq=4, Lk=12, Dk=16, kv_lengths=[5, 12], window=(3, -1),
         packing={"seq_order": [0, 1], "new_keys": 1, "page_size": 256, "block_seed": 3}),
    dict(seed=69, B=2, Hq=2, Lq=6, Lk=10, Dk=8, mask=np.random.default_rng(60).random((2, 1, 6, 10)) < 0.5),
    dict(seed=70, B=1, Hq=2, Lq=1, Lk=33, Dk=64, window=(7, -1), dtype="bfloat16"),   # decode
    dict(seed=71, B=1, Hq=2, Lq=200, Lk=300, Dk=16, window=(16, -1)),   # a window across 128-key blocks
    # a pack whose longest sequence fills whole 64/128/256-key blocks while a shorter one before it does not
    dict(seed=72, B=3, Hq=2, Lq=8, Lk=256, Dk=64, q_lengths=[8, 5, 8], kv_lengths=[10, 256, 37],
         packing={"seq_order": [0, 1, 2]}),
)


def pinned(pins: Iterable[dict[str, Any]], dtype: str | None = None) -> list[Case]:
    """The pinned cases, each in its own dtype or all in `dtype` (inputs drawn for that dtype)."""
    return [fixed_case(**{**p, "dtype": dtype or p.get("dtype", "float32")}) for p in pins]


# ---- property-module strategies (weights, causality, permutation, independence, GQA helper) ----

@st.composite
def onehot_cases(draw, *, max_len: int = 33, max_chunks: int = 4, sinks: bool = False) -> Case:
    """Small cases with Dv = Dk whose weights can be read through one-hot V in at most `max_chunks` calls.

    Dk is raised to ceil(Lk / max_chunks) where needed (q and k redrawn from the case's seed).
    """
    case = draw(cases(max_len=max_len, same_d=True, dv_ne_dk=False, sinks=sinks))
    s = case.shape
    d = max(s["Dk"], -(-s["Lk"] // max_chunks))
    if d == s["Dk"]:
        return case
    rng = np.random.default_rng(case.seed)
    q, k, v = values(rng, {**s, "Dk": d, "Dv": d}, case.regime, case.dtype)
    if case.layout == "broadcast_kv":
        k, v = np.broadcast_to(k[:1], k.shape).copy(), np.broadcast_to(v[:1], v.shape).copy()
    return case.replace(q=q, k=k, v=v, grad_out=None)


@st.composite
def causal_cases(draw, *, max_len: int = 65, alignment: str | None = None, tall: bool = False) -> Case:
    """Cases with causal masking on (both alignments unless `alignment`); `tall`: bottom_right with Lq > Lk."""
    if tall:
        s = draw(_palette(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                          require=lambda s: s["Lq"] > s["Lk"])) if _limit("palette") else None
        if s is not None:
            return draw(_cases_with_palette_shape(s)).replace(causal="bottom_right")
        lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if n < max_len]))
        lq = draw(st.sampled_from([n for n in SMALL_LENGTHS + MEDIUM_LENGTHS if lk < n <= max_len]))
        case = draw(cases_with_shape(lq=lq, lk=lk))
        return case.replace(causal="bottom_right")
    case = draw(cases(max_len=max_len))
    return case.replace(causal=alignment or draw(st.sampled_from(("top_left", "bottom_right"))))


@st.composite
def cases_with_shape(draw, *, lq: int, lk: int, hkv: int | None = None, group: int | None = None,
                     dk: int | None = None, b: int | None = None, **switches) -> Case:
    """Like `cases`, with the given lengths (and head counts / head dim / batch where given) fixed."""
    b = b if b is not None else draw(st.sampled_from((1, 2, 3)))
    hkv = hkv if hkv is not None else draw(st.sampled_from((1, 2, 3)))
    group = group if group is not None else draw(st.sampled_from(GROUPS))
    dk = dk if dk is not None else draw(st.sampled_from((8, 16, 4, 1, 32, 64)))
    while b * hkv * group * lq * lk * 2 * dk > BUDGET and b > 1:
        b -= 1
    s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dk}
    dtype = draw(dtype_choice(switches.pop("dtypes", DTYPES)))
    regime = draw(st.sampled_from(switches.pop("regimes", REGIMES)))
    layouts = switches.pop("layouts", True)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    params = draw(mask_params(rng, s, **switches))
    layout = draw(st.sampled_from(("contiguous", "contiguous")
                                  + tuple(x for x in ("noncontiguous", "broadcast_kv") if allows(x)))) if layouts \
        else "contiguous"
    if layout == "broadcast_kv":
        k, v = np.broadcast_to(k[:1], k.shape).copy(), np.broadcast_to(v[:1], v.shape).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **params)


@st.composite
def gqa_cases(draw, *, max_len: int = 65, mqa: bool = False, **switches) -> Case:
    """Hkv < Hq with distinct KV heads: 2..4 KV heads in groups of 2..4, or Hkv = 1 (MQA) when `mqa`."""
    if _limit("palette"):
        s = draw(_palette(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                          require=lambda s: s["Hq"] > s["Hkv"] and (s["Hkv"] == 1) == mqa))
        if s is not None:
            return draw(_cases_with_palette_shape(s, fit=True, **switches))
    lq = draw(lengths(max_len))
    lk = draw(lengths(max_len)) if draw(st.booleans()) else lq
    lq, lk = fit_lengths(draw, lq, lk)
    hkv = 1 if mqa else draw(st.sampled_from((2, 3, 4, 8)))
    group = draw(st.sampled_from((2, 4, 8) if mqa else (2, 3, 4)))
    return draw(cases_with_shape(lq=lq, lk=lk, hkv=hkv, group=group, **switches))


@st.composite
def _cases_with_palette_shape(draw, s: dict[str, int], *, fit: bool = False, **switches) -> Case:
    """`cases_with_shape` on a palette shape (Dv = Dk); `fit`: lengths fitted to the declared limits."""
    lq, lk = fit_lengths(draw, s["Lq"], s["Lk"]) if fit else (s["Lq"], s["Lk"])
    return draw(cases_with_shape(lq=lq, lk=lk, hkv=s["Hkv"], group=s["Hq"] // s["Hkv"], dk=s["Dk"], b=s["B"],
                                 **switches))


def without_q_lengths(case: Case) -> Case:
    """The case with query padding removed (key padding kept)."""
    return case if case.q_lengths is None else case.replace(q_lengths=None)


# ---- property-module strategies (masks, empty rows, linearity, scale, dropout) ----
# Appended by the masks/linearity/scaling/stability/dropout helper.

def _hide_rows_kept(rng: np.random.Generator, m: np.ndarray) -> np.ndarray:
    """Give every all-False row of a bool mask one True entry (so the mask empties no row)."""
    m = m.copy()
    empty = ~m.any(axis=-1)
    for idx in zip(*np.nonzero(empty)):
        m[idx + (int(rng.integers(m.shape[-1])),)] = True
    return m


@st.composite
def mask_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """A case that certainly has a boolean mask (drawn shape and density), maybe with bias, causal, padding."""
    empty_rows = draw(st.booleans())
    case = draw(cases(max_len=max_len, dtypes=dtypes, empty_rows=empty_rows, layouts=False))
    if case.mask is not None:
        return case
    s = case.shape
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    rng = np.random.default_rng(case.seed + 1)
    mshape = draw(st.sampled_from(((b, 1, lq, lk), (lq, lk), (b, hq, lq, lk), (b, 1, 1, lk))))
    m = rng.random(mshape) < draw(st.sampled_from((0.5, 0.8, 0.2)))
    return case.replace(mask=m if empty_rows else _hide_rows_kept(rng, m))


HIDING = {"mask": "mask", "bias": "bias", "kv_lengths": "kv_lengths"}     # ways to hide a key -> feature


@st.composite
def hidden_key_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """A case in which every batch element has key positions that no query sees, hidden by a
    bool-mask column, a -inf bias column or kv_lengths (on top of what `cases` drew)."""
    empty_rows = draw(st.booleans())
    case = draw(cases(max_len=max_len, dtypes=dtypes, empty_rows=empty_rows))
    s = case.shape
    b, lk = s["B"], s["Lk"]
    rng = np.random.default_rng(case.seed + 2)
    how = draw(declared_choice(HIDING))
    if how == "kv_lengths":
        lo = 1 if not empty_rows and lk > 1 else 0
        n = rng.integers(lo, lk, size=b)
        return case.replace(kv_lengths=n if case.kv_lengths is None else np.minimum(n, case.kv_lengths))
    hide = rng.random((b, lk)) < draw(st.sampled_from((0.25, 0.5)))
    hide[np.arange(b), rng.integers(lk, size=b)] = True
    if not empty_rows and lk > 1:
        keep = rng.integers(lk, size=b)
        hide[np.arange(b), keep] = False
    cols = ~hide[:, None, None, :]
    if how == "mask":
        return case.replace(mask=cols if case.mask is None else np.logical_and(case.mask, cols))
    bias = np.zeros((1, 1, 1, lk)) if case.bias is None else case.bias
    return case.replace(bias=np.where(cols, bias, -np.inf))


EMPTY_SOURCES = {"mask_row": "mask", "bias_row": "bias", "q_lengths": "q_lengths", "kv_lengths": "kv_lengths",
                 "bottom_right": "causal_bottom_right"}          # how a row is emptied -> the feature it needs


@st.composite
def empty_row_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = DTYPES,
                    sources: tuple[str, ...] = tuple(EMPTY_SOURCES)) -> Case:
    """A case that certainly has fully-masked query rows, made by a mask row, a -inf bias row,
    query padding, a zero key length, or bottom-right causal with Lq > Lk."""
    how = draw(declared_choice({k: v for k, v in EMPTY_SOURCES.items() if k in sources}))
    s = draw(_palette_family(max_len, lambda t: t["Lq"] > t["Lk"])) if how == "bottom_right" else None
    if s is None:
        s = draw(shapes(max_len=max_len))
        if how == "bottom_right":
            s["Lq"] = max(s["Lq"], 2)
            s["Lk"] = draw(st.integers(1, s["Lq"] - 1))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, draw(st.sampled_from(("ordinary", "ordinary", "large"))), dtype)
    p = draw(mask_params(rng, s, causal=how != "bottom_right"))
    b, lq, lk = s["B"], s["Lq"], s["Lk"]
    where = (int(rng.integers(b)), int(rng.integers(lq)))
    if how == "bottom_right":
        p["causal"] = "bottom_right"
        p.pop("q_lengths", None)
        p.pop("kv_lengths", None)
    elif how == "mask_row":
        m = np.ones((b, 1, lq, lk), dtype=bool)
        m[where[0], :, where[1], :] = False
        p["mask"] = m if p.get("mask") is None else np.logical_and(p["mask"], m)
    elif how == "bias_row":
        old = p.get("bias", np.zeros((1, 1, 1, 1)))
        bias = np.broadcast_to(old, np.broadcast_shapes(old.shape, (b, 1, lq, lk))).copy()
        bias[where[0], :, where[1], :] = -np.inf
        p["bias"] = bias
    elif how == "q_lengths":
        ql = p.get("q_lengths", rng.integers(0, lq + 1, size=b)).copy()
        ql[where[0]] = min(ql[where[0]], int(rng.integers(0, lq)))
        p["q_lengths"] = ql
    else:
        kl = p.get("kv_lengths", rng.integers(0, lk + 1, size=b)).copy()
        kl[where[0]] = 0
        p["kv_lengths"] = kl
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime="ordinary", **p)


@st.composite
def per_batch_mask_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """B >= 2 and a mask, -inf bias or lengths that certainly differ between batch elements."""
    s = draw(_palette_family(max_len, lambda t: t["B"] >= 2))
    if s is None:
        s = draw(shapes(max_len=max_len))
        s["B"] = draw(st.sampled_from((2, 3)))
        if s["B"] * s["Hq"] * s["Lq"] * s["Lk"] * (s["Dk"] + s["Dv"]) > BUDGET:
            s["Hq"] = s["Hkv"] = 1
            s["Dk"] = s["Dv"] = min(s["Dk"], 16)
    b, hq, lq, lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, "ordinary", dtype)
    p = draw(mask_params(rng, s, masks=False, bias=False, padding=False))
    how = draw(declared_choice({**HIDING, "q_lengths": "q_lengths"}))
    if how in ("mask", "bias"):
        shape = draw(st.sampled_from(((b, 1, lq, lk), (b, hq, lq, lk), (b, 1, 1, lk))))
        m = rng.random(shape) < 0.5
        if (m == m[:1]).all():
            m[1].flat[int(rng.integers(m[1].size))] ^= True
        if how == "mask":
            p["mask"] = m
        else:
            p["bias"] = np.where(m, rng.normal(size=shape), -np.inf)
    else:
        n = lk if how == "kv_lengths" else lq
        lens = rng.integers(0, n + 1, size=b)
        if (lens == lens[0]).all():
            lens[1] = (lens[0] + 1) % (n + 1)
        p[how] = lens
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


@st.composite
def identical_key_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, sinks: bool = False) -> Case:
    """Every key of a (batch, KV head) is the same vector; bool masks, causal and padding allowed, no bias;
    `sinks` as in `cases`."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, bias=False, sinks=sinks))
    return case.replace(k=np.broadcast_to(case.k[:, :, :1], case.k.shape).copy())


CUSTOM_SCALES = (0.5, 1.0, 0.125, 2.0, 0.01, 0.3)


@st.composite
def two_key_cases(draw, *, dk=None, dtypes: tuple[str, ...] = DTYPES, custom_scale: bool = True) -> Case:
    """Lk = 2 with V rows e_0 and e_1 (or [1] and [0] when Dv = 1): out[i, 0] = sigmoid(scale * q_i.(k0 - k1)).

    Each query is built so that scale * q_i.(k0 - k1) lies in +-[0.5, 2.5], where the
    recovered scale is well conditioned."""
    d = draw(dk if dk is not None else st.sampled_from(_head_dims()))
    dv = draw(st.sampled_from((d, d, 1, 2)))
    dtype = draw(dtype_choice(dtypes))
    hq, lq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 3, 8)))
    scale = draw(st.sampled_from((None, None, None) + CUSTOM_SCALES)) if custom_scale else None
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(d) if scale is None else scale
    k0 = rng.normal(size=(1, hq, 1, d))
    gap = rng.normal(size=(1, hq, 1, d))
    gap *= np.sqrt(d) / np.linalg.norm(gap, axis=-1, keepdims=True)       # |k0 - k1|^2 = Dk
    k = np.concatenate([k0, k0 - gap], axis=2)
    z = rng.uniform(0.5, 2.5, size=(1, hq, lq, 1)) * rng.choice((-1.0, 1.0), size=(1, hq, lq, 1))
    noise = rng.normal(size=(1, hq, lq, d))
    noise -= (noise * gap).sum(-1, keepdims=True) * gap / d                 # orthogonal to the gap
    q = z / (s * d) * gap + noise
    v = np.zeros((1, hq, 2, dv))
    v[:, :, 0, 0] = 1.0
    if dv > 1:
        v[:, :, 1, 1] = 1.0
    return Case.build(q, k, v, dtype=dtype, seed=seed, scale=scale)


# No p = 0.5 among the dropout probabilities: there 1/p == 1/(1-p), and a kernel rescaling by 1/p would pass.
DROPOUT_PROBABILITIES = (0.1, 0.3, 0.7)


@st.composite
def dropout_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                  probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """One-hot V (Dv = Lk <= 16, V[j] = e_j), so each output entry is one dropped-or-kept weight;
    moderate logits (no weight near 0), no empty rows, at least 64 entries per call."""
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    lq, lk = draw(st.sampled_from((4, 8, 16))), draw(st.sampled_from((4, 8, 16)))
    while b * hq * lq * lk < 64:
        hq *= 2
    d = draw(st.sampled_from((4, 8, 16)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    q = 0.5 * rng.normal(size=(b, hq, lq, d))
    k = 0.5 * rng.normal(size=(b, hq, lk, d))
    v = np.broadcast_to(np.eye(lk), (b, hq, lk, lk)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, causal=draw(st.sampled_from((None, "top_left"))),
                      dropout_p=draw(st.sampled_from(probabilities)))


@st.composite
def dropout_cooccurrence_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                               probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """Q = K = 0 (every weight 1/L) and one-hot V (Dk = Dv = Lq = Lk = L, V[j] = e_j), B = 2, H even, no
    mask: each output entry is 0 (dropped) or 1/(L (1 - p)) (kept), so the keep mask of every batch
    element, head, query row and key is read off the output, and each pairs with a neighbour along
    every axis."""
    h = draw(st.sampled_from((2, 4)))
    n = draw(st.sampled_from((16, 32)))        # at least 512 pairs per call and axis: a few calls suffice
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    q, k = np.zeros((2, h, n, n)), np.zeros((2, h, n, n))
    v = np.broadcast_to(np.eye(n), (2, h, n, n)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, dropout_p=draw(st.sampled_from(probabilities)))


@st.composite
def dropout_grad_cases(draw, *, dtypes: tuple[str, ...] = DTYPES,
                       probabilities: tuple[float, ...] = DROPOUT_PROBABILITIES) -> Case:
    """One-hot V (Dk = Dv = Lk, V[j] = e_j) with moderate logits, as `dropout_cases`, grouped key/value
    heads where the implementation takes them, and an upstream gradient dO of standard normal entries."""
    b, hkv = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    hq = hkv * (draw(st.sampled_from((1, 2))) if allows("gqa") else 1)
    lq, lk = draw(st.sampled_from((4, 8, 16))), draw(st.sampled_from((4, 8, 16)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    q = 0.5 * rng.normal(size=(b, hq, lq, lk))
    k = 0.5 * rng.normal(size=(b, hkv, lk, lk))
    v = np.broadcast_to(np.eye(lk), (b, hkv, lk, lk)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, grad_out=rng.normal(size=(b, hq, lq, lk)),
                      causal=draw(st.sampled_from((None, "top_left"))), dropout_p=draw(st.sampled_from(probabilities)))


# ---- variant strategies (sliding window, softcap, ALiBi, sinks, decode, lse) ----
# Appended by the reference/variants helper. Each takes `dtypes=` and draws the dtype with
# `dtype_choice(dtypes)` (through `cases`, or directly): the cell's dtype, inside the declared scope.

ALIGNMENTS = ("bottom_right", "top_left")


def _window_side(draw, lk: int) -> int:
    """-1 (unbounded), a bound of 0..3 keys, or a bound of a quarter or half of Lk: values that matter."""
    return draw(st.sampled_from((-1, 0, 1, 2, 3, max(lk // 4, 1), max(lk // 2, 1))))


@st.composite
def window_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, causal: bool = True,
                 empty_rows: bool = True, grad: bool = False, layouts: bool = False, **switches) -> Case:
    """A case with a sliding window (ATTN-WIN-*): either alignment, each side -1 or a bound that matters
    (0..3 keys, Lk/4, Lk/2), at least one side bounded; combined with causal masking of either alignment,
    masks and padding as `cases` draws them. Lq != Lk half the time, so alignment matters, and bottom-right
    windows over Lq > Lk or top-left windows past Lk leave rows empty (not with empty_rows=False, which
    also keeps masks and padding from emptying rows and widens a window that would)."""
    if draw(st.integers(0, 7)) == 0:    # now and then lengths past 128-key blocks, where local kernels skip blocks
        max_len = max(max_len, max(LARGE_LENGTHS))
    case = draw(cases(max_len=max_len, dtypes=dtypes, causal=causal, empty_rows=empty_rows, grad=grad,
                      layouts=layouts, **switches))
    lk = case.shape["Lk"]
    left, right = _window_side(draw, lk), _window_side(draw, lk)
    if left == right == -1:
        left = draw(st.sampled_from((0, 1, 2)))
    out = case.replace(window=(left, right), window_align=draw(st.sampled_from(ALIGNMENTS)))
    if not empty_rows and not visible_rows_only(out):
        out = out.replace(window=(left, -1), window_align="bottom_right", causal=None)
        if not visible_rows_only(out):
            out = out.replace(window=(-1, max(right, 0)), window_align="bottom_right")
    return out


def _scaled_logit_max(case: Case) -> float:
    """max |s <q, k>| over the case (float64), the magnitude a softcap is drawn against."""
    from attnconf.reference import expand_kv

    k = expand_kv(case.k, case.shape["Hq"])
    if k.shape[2] == 0:
        return 0.0
    return float(np.abs(case.effective_scale * np.einsum("bhid,bhjd->bhij", case.q, k)).max(initial=0.0))


@st.composite
def softcap_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                  windows: bool = True, alibi: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with a softcap comparable to its logits (ATTN-CAP-*): c = factor * max|s q.k| with factor
    in (0.05, 0.3, 1, 3), so the cap bends the largest logits hard, some, or barely; the value regimes of
    `cases` (ordinary to 1e4) all occur. Sometimes with a window or ALiBi as well."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    top = _scaled_logit_max(case)
    factor = draw(st.sampled_from((0.05, 0.3, 1.0, 3.0)))
    cap = float(f"{max(factor * top, 0.05):.3g}")
    changes: dict = {"softcap": cap}
    if windows and draw(st.integers(0, 3)) == 0:
        lk = case.shape["Lk"]
        changes["window"] = (max(_window_side(draw, lk), 0), _window_side(draw, lk))
        changes["window_align"] = draw(st.sampled_from(ALIGNMENTS))
    if alibi and draw(st.integers(0, 3)) == 0:
        changes["alibi_slopes"] = draw(alibi_slopes(case))
    return case.replace(**changes)


def geometric_slopes(hq: int) -> np.ndarray:
    """The ALiBi paper's schedule: 2^(-8 i / n) for i = 1..n with n = Hq when Hq is a power of two; otherwise
    n is the power of two below Hq and the remaining Hq - n heads take every other slope of the 2n schedule
    (the rule of the paper's reference code, which models are trained with)."""
    n = 1 << (max(hq, 1).bit_length() - 1)
    base = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    extra = (2.0 ** (-8.0 * np.arange(1, 2 * n + 1) / (2 * n)))[0::2][:hq - n]
    return np.concatenate([base, extra])


ALIBI_SLOPE_KINDS = ("paper", "geometric", "uniform", "with_zero", "steep", "negative", "mixed_sign")


def slopes_of_kind(kind: str, hq: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Slopes of `shape` (last axis Hq). The spec allows any finite slope (ATTN-ALIBI-1), so beside the
    trained schedules (paper: 2^(-8h/Hq) as written; geometric: the reference code's rule for any Hq) come
    slopes above 1 (steep: up to 8, where a row sees its diagonal key only), negative ones (the bias then
    grows with distance: far keys dominate) and both signs in one call."""
    if kind in ("paper", "geometric"):
        row = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq) if kind == "paper" else geometric_slopes(hq)
        return np.broadcast_to(row, shape).copy()
    if kind == "steep":
        return rng.uniform(1.0, 8.0, shape)
    sl = rng.uniform(0.0, 1.0, shape)
    if kind == "negative":
        return -sl
    if kind == "mixed_sign":
        return sl * rng.choice((-1.0, 1.0), shape)
    if kind == "with_zero":
        sl.reshape(-1)[int(rng.integers(sl.size))] = 0.0
    return sl


@st.composite
def alibi_slopes(draw, case: Case) -> np.ndarray:
    """Slopes of shape (Hq,) or (B, Hq), of one of ALIBI_SLOPE_KINDS (slopes_of_kind)."""
    b, hq = case.shape["B"], case.shape["Hq"]
    shape = draw(st.sampled_from(((hq,), (b, hq))))
    rng = np.random.default_rng(case.seed + 3)
    return slopes_of_kind(draw(st.sampled_from(ALIBI_SLOPE_KINDS)), hq, shape, rng)


@st.composite
def alibi_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                windows: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with ALiBi slopes (ATTN-ALIBI-*), per head (Hq,) or per batch and head (B, Hq), either
    alignment, with or without causal masking, padding (per-sequence offsets) and sometimes a window."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    changes: dict = {"alibi_slopes": draw(alibi_slopes(case)), "window_align": draw(st.sampled_from(ALIGNMENTS))}
    if windows and draw(st.integers(0, 3)) == 0:
        lk = case.shape["Lk"]
        changes["window"] = (_window_side(draw, lk), max(_window_side(draw, lk), 0))
    return case.replace(**changes)


SINK_OFFSETS = (-40.0, -5.0, -1.0, 0.0, 1.0, 5.0, 40.0)


@st.composite
def sink_values(draw, case: Case) -> np.ndarray:
    """Per-head sinks placed against the heads' typical lse: far below (no effect), comparable, or far
    above (the sink dominates and scales rows by ~exp(lse - sink)); 0-centred when no row sees a key."""
    offer("sinks")
    from attnconf.reference import oracle

    base = oracle(case.replace(sinks=None)).lse
    hq = case.shape["Hq"]
    centre = np.zeros(hq)
    for h in range(hq):
        fin = base[:, h][np.isfinite(base[:, h])]
        centre[h] = float(np.median(fin)) if fin.size else 0.0
    offsets = np.array([draw(st.sampled_from(SINK_OFFSETS)) for _ in range(min(hq, 4))])
    sinks = centre + np.resize(offsets, hq)
    if case.dtype == "float16":
        sinks = np.clip(sinks, -6e4, 6e4)
    return sinks


@st.composite
def sink_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
               windows: bool = True, layouts: bool = False, **switches) -> Case:
    """A case with per-head sinks (ATTN-SINK-*), small and dominant (see `sink_values`), sometimes with a
    window; masks, padding and causal masking give rows with no key, whose lse must be the sink."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    if windows and draw(st.integers(0, 2)) == 0:
        lk = case.shape["Lk"]
        case = case.replace(window=(_window_side(draw, lk), _window_side(draw, lk)),
                            window_align=draw(st.sampled_from(ALIGNMENTS)))
    return case.replace(sinks=draw(sink_values(case)))


DECODE_LENGTHS = (1, 2, 17, 127, 128, 129, 255, 256, 257, 511, 1023, 1024, 2049, 4096)


@st.composite
def decode_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, lengths: tuple[int, ...] = DECODE_LENGTHS,
                 variants: bool = True) -> Case:
    """Decode (ATTN-DECODE-1): Lq = 1 against a long KV, GQA groups up to 8, per-sequence kv lengths,
    bottom-right causal (the query on the last key); with a window (w, -1 or 0), softcap, ALiBi and sinks
    each half the time when `variants`."""
    s = draw(_palette(gqa=True, cross=True, dv_ne_dk=False, max_len=max(lengths),
                      require=lambda t: t["Lq"] == 1 and t["Lk"] in lengths)) if _limit("palette") else None
    if s is None:
        lk = draw(st.sampled_from(lengths))
        hkv = draw(st.sampled_from((1, 2)))
        group = draw(st.sampled_from((1, 4, 8)))
        d = draw(st.sampled_from((64, 128, 32, 8)))
        b = draw(st.sampled_from((1, 2, 3)))
        while b * hkv * group * lk * 2 * d > BUDGET and (b > 1 or group > 1 or d > 8):
            if b > 1:
                b -= 1
            elif group > 1:
                group //= 2
            else:
                d //= 2
        s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": 1, "Lk": lk, "Dk": d, "Dv": d}
    b, lk = s["B"], s["Lk"]
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, draw(st.sampled_from(("ordinary", "ordinary", "large", "near_ties"))), dtype)
    p: dict = {"causal": draw(st.sampled_from(("bottom_right", None)))}
    if b > 1 and draw(st.booleans()):
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
    case = Case.build(q, k, v, dtype=dtype, seed=seed, **p)
    if variants:
        changes: dict = {}
        if allows("window_bottom_right") and draw(st.booleans()):
            changes["window"] = (draw(st.sampled_from((0, 1, 7, 63, 255, 1000))), draw(st.sampled_from((-1, 0))))
        if allows("softcap") and draw(st.booleans()):
            changes["softcap"] = float(f"{max(0.3 * _scaled_logit_max(case), 0.05):.3g}")
        if allows("alibi") and draw(st.booleans()):
            changes["alibi_slopes"] = draw(alibi_slopes(case))
        case = case.replace(**changes) if changes else case
        if allows("sinks"):
            offer("sinks")
            if draw(st.booleans()):
                case = case.replace(sinks=draw(sink_values(case)))
    return case


def variant_alignments(*features: str) -> tuple[str, ...]:
    """The alignments under which the implementation declares every feature of `features` (window,
    alibi): window_<alignment>; ALiBi top-left is its own capability (alibi_top_left)."""
    out = []
    for align in ALIGNMENTS:
        need = [("window_" + align) if f == "window" else ("alibi_top_left" if align == "top_left" else "alibi")
                for f in features]
        if allows(*need):
            out.append(align)
    return tuple(out)


@st.composite
def variant_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, grad: bool = False,
                  sinks: bool = True, layouts: bool = False, **switches) -> Case:
    """Any mixture of the variants (window, softcap, ALiBi, sinks), at least one, on top of `cases`."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, grad=grad, layouts=layouts, **switches))
    lk = case.shape["Lk"]
    offered = tuple(f for f in (("window", "softcap", "alibi", "sinks") if sinks else ("window", "softcap", "alibi"))
                    if {"window": bool(variant_alignments("window")), "alibi": bool(variant_alignments("alibi")),
                        "softcap": allows("softcap"), "sinks": allows("sinks")}[f])
    if not offered:          # the implementation declares none of the variants: a plain case
        return case
    if "sinks" in offered:
        offer("sinks")
    on = draw(st.lists(st.sampled_from(offered), min_size=1, max_size=len(offered), unique=True))
    changes: dict = {}
    if "window" in on:
        changes["window"] = (_window_side(draw, lk), _window_side(draw, lk))
    if "softcap" in on:
        changes["softcap"] = float(f"{max(draw(st.sampled_from((0.1, 0.5, 2.0))) * _scaled_logit_max(case), 0.05):.3g}")
    if "alibi" in on:
        changes["alibi_slopes"] = draw(alibi_slopes(case))
    if changes:
        aligns = variant_alignments(*[f for f in ("window", "alibi") if f in on]) or ALIGNMENTS
        changes["window_align"] = draw(st.sampled_from(aligns))
        case = case.replace(**changes)
    if "sinks" in on:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


@st.composite
def window_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33) -> Case:
    """Q = 0 and V = the identity (Dk = Dv = Lk): every visible key of a row has weight 1/|J| and the output
    row *is* the weight row, so the keys at and just past each inclusive bound of ATTN-WIN-1 can be read
    off one by one. Either alignment, Lq != Lk half the time, GQA, sometimes causal and padding."""
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if 2 <= n <= max_len]))
    lq = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= max_len])) if draw(st.booleans()) else lk
    hkv, group, b = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = np.zeros((b, hkv * group, lq, lk))
    k = rng.normal(size=(b, hkv, lk, lk))
    v = np.broadcast_to(np.eye(lk), (b, hkv, lk, lk)).copy()
    p: dict = {"window": (_window_side(draw, lk), _window_side(draw, lk)),
               "window_align": draw(st.sampled_from(ALIGNMENTS)),
               "causal": draw(st.sampled_from((None, None, "top_left", "bottom_right")))}
    if p["window"] == (-1, -1):
        p["window"] = (1, 1)
    if draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
        p["q_lengths"] = rng.integers(1, lq + 1, size=b)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


@st.composite
def window_empty_row_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33, sinks: bool = False) -> Case:
    """A window that certainly leaves rows without a key: bottom-right with Lq > Lk + right (the top rows
    end before key 0), or top-left with Lq > Lk + left (the bottom rows start past the last key); no
    padding or masks, so the window alone empties them. With `sinks`, per-head sinks as well."""
    align = draw(st.sampled_from(ALIGNMENTS))
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= min(16, max_len)]))
    near = draw(st.integers(0, 3))
    lq = min(lk + near + draw(st.integers(1, 9)), max(max_len, lk + near + 1))
    far = draw(st.sampled_from((-1, 0, 1, 2, 5)))
    window = (far, near) if align == "bottom_right" else (near, far)
    case = draw(cases_with_shape(lq=lq, lk=lk, dtypes=dtypes, masks=False, padding=False, bias=False, layouts=False,
                                 causal=False))
    case = case.replace(window=window, window_align=align)
    if sinks:
        case = case.replace(sinks=draw(sink_values(case)))
    return case


@st.composite
def softcap_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES) -> Case:
    """Logits up to ~1e3 against a small cap c in (0.25, 0.5, 1), V = the identity (Dk = Dv = Lk, at least
    4 keys): ATTN-CAP-2 bounds every visible weight by exp(-2c)/n .. exp(2c)/n whatever the logits are."""
    lk = draw(st.sampled_from((4, 5, 8, 11, 16, 17, 32)))
    lq = draw(st.sampled_from((1, 3, 8, 16)))
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mag = draw(st.sampled_from((30.0, 300.0, 1000.0)))
    q = rng.normal(size=(b, hq, lq, lk)) * np.sqrt(mag)
    k = rng.normal(size=(b, hq, lk, lk)) * np.sqrt(mag)
    v = np.broadcast_to(np.eye(lk), (b, hq, lk, lk)).copy()
    return Case.build(q, k, v, dtype=dtype, seed=seed, softcap=draw(st.sampled_from((0.25, 0.5, 1.0))),
                      causal=draw(st.sampled_from((None, "bottom_right"))))


@st.composite
def alibi_probe_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, max_len: int = 33) -> Case:
    """Q = 0 and V = the identity: row i's weights are exp(-m |i + off - j|) normalised, so the output shows
    the ALiBi bias itself (sign, absolute value, offset, alignment, per-batch slopes). Slopes in [0.05, 1]
    keep the weights of a few keys on each side of the diagonal readable in every dtype; either sign (a
    negative slope moves the weight to the farthest keys, which shows the sign and the distance as well)."""
    lk = draw(st.sampled_from([n for n in SMALL_LENGTHS if 3 <= n <= max_len]))
    lq = draw(st.sampled_from([n for n in SMALL_LENGTHS if n <= max_len])) if draw(st.booleans()) else lk
    b, hq = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    dtype = draw(dtype_choice(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = draw(st.sampled_from(((hq,), (b, hq))))
    q = np.zeros((b, hq, lq, lk))
    k = rng.normal(size=(b, 1, lk, lk))
    v = np.broadcast_to(np.eye(lk), (b, 1, lk, lk)).copy()
    p: dict = {"alibi_slopes": rng.uniform(0.05, 1.0, shape) * rng.choice((-1.0, 1.0), shape), "window_align": draw(st.sampled_from(ALIGNMENTS)),
               "causal": draw(st.sampled_from((None, None, "bottom_right", "top_left")))}
    if draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(1, lk + 1, size=b)
        p["q_lengths"] = rng.integers(1, lq + 1, size=b)
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


def alibi_as_bias(case: Case) -> Case:
    """The case with its ALiBi slopes replaced by the explicit bias of ATTN-ALIBI-1 (added to any bias)."""
    from attnconf.reference.attention import alibi_bias

    s = case.shape
    ali = alibi_bias((s["B"], s["Hq"], s["Lq"], s["Lk"]), case.alibi_slopes, case.window_align,
                     case.q_lengths, case.kv_lengths)
    return case.replace(alibi_slopes=None, bias=ali if case.bias is None else ali + case.bias)


# ---- calling-convention strategies (varlen, paged KV cache, lse, argument probes) ----
# Appended by the conventions helper. Cases in the vocabulary modern kernels share: bottom-right
# causal, sliding windows, softcap, ALiBi, GQA, per-sequence lengths, and `packing` choices.
# Tests fit them to the implementation's scope with conformance/engine/scope_fit.py.

CONV_HEAD_DIMS = (8, 16, 4, 32, 64, 1, 3, 40, 128)
WINDOW_BOUNDS = (-1, 0, 1, 2, 3, 7, 16)
SOFTCAPS = (0.5, 1.0, 5.0, 30.0, 50.0)


def convention_alibi_slopes(rng: np.random.Generator, b: int, hq: int, how: str) -> np.ndarray:
    """ALiBi slopes: the paper's geometric schedule (geometric_slopes, any H), random in [0.01, 1], per
    (batch, head), or of another of ALIBI_SLOPE_KINDS (above 1, negative, both signs); float32 values (the
    flash-attention convention passes slopes as float32)."""
    if how == "geometric":
        slopes = geometric_slopes(hq)
    elif how == "batch":
        slopes = rng.uniform(0.01, 1.0, size=(b, hq))
    elif how in ALIBI_SLOPE_KINDS:
        slopes = slopes_of_kind(how, hq, (hq,), rng)
    else:
        slopes = rng.uniform(0.01, 1.0, size=hq)
    return slopes.astype(np.float32).astype(np.float64)


@st.composite
def convention_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, regimes: tuple[str, ...] = REGIMES,
                     lengths_: bool = True, softcap: bool = True, alibi: bool = True, window: bool = True,
                     causal: bool = True, empty_rows: bool = True, grad: bool = False, min_b: int = 1,
                     lq_pool: tuple[int, ...] | None = None, lk_pool: tuple[int, ...] | None = None) -> Case:
    """A case made of what flash-attention-style kernels take: GQA, Lq != Lk, bottom-right causal
    (top-left where Lq == Lk), a sliding window (left, right), softcap, ALiBi, lengths, a custom scale.
    `lq_pool` / `lk_pool` fix the lengths to draw from (default: `lengths(max_len)`)."""
    s = draw(_palette(gqa=True, cross=True, dv_ne_dk=False, max_len=max_len,
                      require=lambda t: t["B"] >= min_b and t["Lq"] in (lq_pool or (t["Lq"],))
                      and t["Lk"] in (lk_pool or (t["Lk"],)))) if _limit("palette") else None
    if s is not None:
        b, lq, lk = s["B"], *fit_lengths(draw, s["Lq"], s["Lk"])
        s = {**s, "Lq": lq, "Lk": lk}
    else:
        lq = draw(st.sampled_from(lq_pool)) if lq_pool else draw(lengths(max_len))
        if lk_pool:
            lk = draw(st.sampled_from(lk_pool))
        else:
            lk = draw(lengths(max_len)) if draw(st.booleans()) else lq
        lq, lk = fit_lengths(draw, lq, lk)
        hkv = draw(st.sampled_from((1, 2, 3)))
        group = draw(st.sampled_from((1, 2, 3, 4)))
        dk = draw(st.sampled_from(CONV_HEAD_DIMS))
        b = draw(st.sampled_from(tuple(n for n in (1, 2, 3) if n >= min_b)))
        while b * hkv * group * lq * lk * 2 * dk > BUDGET and (b > min_b or hkv > 1):
            if b > min_b:
                b -= 1
            else:
                hkv -= 1
        s = {"B": b, "Hq": hkv * group, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dk}
    dtype = draw(dtype_choice(dtypes))
    regime = draw(st.sampled_from(regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q, k, v = values(rng, s, regime, dtype)
    p: dict = {}
    if causal and draw(st.integers(0, 2)) == 0:
        p["causal"] = draw(st.sampled_from(("bottom_right", "bottom_right", "top_left"))) if lq == lk else "bottom_right"
    if window and draw(st.integers(0, 2)) == 0:
        left, right = draw(st.sampled_from(WINDOW_BOUNDS)), draw(st.sampled_from(WINDOW_BOUNDS))
        if left == right == -1:
            left = 0
        p["window"] = (left, right)
        p["window_align"] = draw(st.sampled_from(("bottom_right", "top_left"))) if lq == lk else "bottom_right"
    if softcap and draw(st.integers(0, 3)) == 0:
        p["softcap"] = draw(st.sampled_from(SOFTCAPS))
    if alibi and draw(st.integers(0, 3)) == 0:
        p["alibi_slopes"] = convention_alibi_slopes(rng, b, s["Hq"], draw(st.sampled_from(("geometric", "uniform", "batch",
                                                                                        "steep", "negative", "mixed_sign"))))
    if lengths_ and draw(st.integers(0, 3)) == 0:
        p["kv_lengths"] = rng.integers(0 if empty_rows else 1, lk + 1, size=b)
        if draw(st.booleans()):
            p["q_lengths"] = rng.integers(0 if empty_rows else 1, lq + 1, size=b)
    if draw(st.integers(0, 4)) == 0:
        p["scale"] = draw(st.sampled_from(CUSTOM_SCALES))
    layout = draw(st.sampled_from(("contiguous", "contiguous", "noncontiguous")))
    if grad:
        p["grad_out"] = rng.normal(size=(b, s["Hq"], lq, s["Dv"]))
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime=regime, layout=layout, **p)


@st.composite
def varlen_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, empty: bool = False) -> Case:
    """A packed batch of 2..4 sequences of different lengths (`empty`: at least one has no queries or
    no keys), maybe with causal, window, softcap, ALiBi; the pack order is drawn into packing["seq_order"]."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, lengths_=False, min_b=2,
                                 regimes=("ordinary", "ordinary", "large", "mixed")))
    s = case.shape
    b = s["B"]
    rng = np.random.default_rng(case.seed + 3)
    kl = rng.integers(1, s["Lk"] + 1, size=b)
    ql = rng.integers(1, s["Lq"] + 1, size=b)
    if empty:
        which = int(rng.integers(b))
        if draw(st.booleans()):
            kl[which] = 0
        else:
            ql[which] = 0
    order = [int(i) for i in rng.permutation(b)]
    return case.replace(q_lengths=ql, kv_lengths=kl, packing={"seq_order": order}, grad_out=None)


def perturb_sequence(case: Case, b: int, rng: np.random.Generator) -> Case:
    """The case with every query, key and value of sequence b (padding included) redrawn, three times larger."""
    q, k, v = case.q.copy(), case.k.copy(), case.v.copy()
    q[b], k[b], v[b] = (3.0 * rng.normal(size=x[b].shape) for x in (q, k, v))
    if case.dtype == "float16":
        q = np.clip(q, -3e4, 3e4)
    return case.replace(q=q, k=k, v=v)


PAGED_LQ = (1, 1, 2, 3, 5, 8)
PAGED_LK = (1, 5, 17, 64, 255, 256, 257, 300, 385, 513)


@st.composite
def paged_cases(draw, *, dtypes: tuple[str, ...] = DTYPES, append: bool | None = None) -> Case:
    """A KV-cache case (decode-like: a few queries, up to 513 keys so that sequences cross page
    boundaries; no query padding) with an explicit paged layout: packing page_size (256 or 512, as the
    convention requires), block_seed, spare_blocks and new_keys (appended in the call; `append` forces
    some or none)."""
    case = draw(convention_cases(dtypes=dtypes, lengths_=False, regimes=("ordinary", "large"), lq_pool=PAGED_LQ,
                                 lk_pool=PAGED_LK))
    s = case.shape
    rng = np.random.default_rng(case.seed + 5)
    kl = rng.integers(1, s["Lk"] + 1, size=s["B"]) if draw(st.booleans()) else None
    shortest = int(kl.min()) if kl is not None else s["Lk"]
    if append is None:
        append = draw(st.booleans())
    new = int(draw(st.integers(1, max(1, min(shortest, 4))))) if append else 0
    packing = {"page_size": draw(st.sampled_from((256, 256, 512))), "block_seed": draw(st.integers(0, 2**31 - 1)),
               "spare_blocks": draw(st.integers(0, 3)), "new_keys": min(new, shortest)}
    return case.replace(kv_lengths=kl, q_lengths=None, packing=packing, grad_out=None)


@st.composite
def lse_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16"),
              masks: bool = True) -> Case:
    """Cases whose lse the tolerance model judges soundly today: causal, windows, lengths, GQA, custom
    scale, plus (`masks`) boolean masks, and no softcap or ALiBi (the emulated baseline does not
    model them yet, so their lse allowance would be loose)."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, softcap=False, alibi=False))
    if masks and draw(st.integers(0, 3)) == 0:
        s = case.shape
        rng = np.random.default_rng(case.seed + 7)
        case = case.replace(mask=rng.random((s["B"], 1, s["Lq"], s["Lk"])) < 0.7)
    return case


@st.composite
def lse_merge_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")) -> Case:
    """No causal, window or ALiBi (splitting the keys would move their alignment), Lk >= 2, no empty
    rows: the keys can be split into chunks whose LSE-weighted outputs merge into the whole."""
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, causal=False, window=False, alibi=False,
                                 softcap=False, empty_rows=False, regimes=("ordinary", "large", "mixed")))
    if case.shape["Lk"] < 2:
        rng = np.random.default_rng(case.seed)
        s = {**case.shape, "Lk": 5}
        _, k, v = values(rng, s, case.regime, case.dtype)
        case = case.replace(k=k, v=v, kv_lengths=None)
    return case


PROBE_FEATURES = ("window", "softcap", "alibi", "sinks", "mask", "bias", "causal", "dropout", "scale", "kv_lengths")


@st.composite
def probe_cases(draw, feature: str, *, dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")) -> Case:
    """A small plain case with `feature` turned on strongly enough that ignoring it moves the output by
    far more than any tolerance (ATTN-ARG-1); see `probe_case`."""
    hkv = draw(st.sampled_from((1, 2)))
    lq = draw(st.sampled_from((4, 7, 9, 16)))
    return probe_case(feature, seed=draw(st.integers(0, 2**32 - 1)), dtype=draw(dtype_choice(dtypes)),
                      b=draw(st.sampled_from((1, 2))), hkv=hkv, hq=hkv * draw(st.sampled_from((1, 2))), lq=lq,
                      lk=draw(st.sampled_from((lq, lq, 5, 13, 17))), d=draw(st.sampled_from((8, 16))),
                      window=(draw(st.sampled_from((0, 1, 2))), draw(st.sampled_from((0, 1, -1)))),
                      align=draw(st.sampled_from(("bottom_right", "top_left"))),
                      softcap=draw(st.sampled_from((0.5, 1.0))), causal=draw(st.sampled_from(("bottom_right", "top_left"))))


def probe_case(feature: str, *, seed: int = 0, dtype: str = "float32", b: int = 1, hkv: int = 1, hq: int = 2,
               lq: int = 7, lk: int = 7, d: int = 16, window: tuple[int, int] = (1, 0), align: str = "bottom_right",
               softcap: float = 1.0, causal: str = "bottom_right") -> Case:
    """A window of a few keys, softcap 1 on logits ~ 10, ALiBi slopes ~ 1, a sink logit of 5, a mask
    hiding half the keys (no empty row), a bias ~ 3, causal, dropout 0.5 on one-hot V, a scale 4x the
    default, the first sequence's keys padded to half: the feature on; the plain case is the same with it off."""
    rng = np.random.default_rng(seed)
    s = {"B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": d, "Dv": d}
    q, k, v = values(rng, s, "ordinary", dtype)
    p: dict = {}
    if feature == "window":
        p["window"], p["window_align"] = window, align
    elif feature == "softcap":
        q = q * 4.0                                  # logits of about +-10 against a cap of 1
        p["softcap"] = softcap
    elif feature == "alibi":
        p["alibi_slopes"] = rng.uniform(0.5, 2.0, size=hq).astype(np.float32).astype(np.float64)
    elif feature == "sinks":
        offer("sinks")
        p["sinks"] = np.full(hq, 5.0)
    elif feature == "mask":
        m = rng.random((b, 1, lq, lk)) < 0.5
        m[..., 0] = True                             # no empty rows: the effect is the mask's alone
        p["mask"] = m
    elif feature == "bias":
        p["bias"] = 3.0 * rng.normal(size=(b, hq, lq, lk))
    elif feature == "causal":
        p["causal"] = causal
    elif feature == "dropout":
        v = np.broadcast_to(np.eye(lk)[None, None], (b, hkv, lk, lk)).copy()
        q, k = 0.5 * q, 0.5 * k
        p["dropout_p"] = 0.5
    elif feature == "scale":
        p["scale"] = 4.0 / np.sqrt(d)
    elif feature == "kv_lengths":
        p["kv_lengths"] = np.array([max(1, lk // 2), lk])[:b]        # the first sequence shorter than the next
    else:
        raise ValueError(f"no probe for {feature!r}")
    return Case.build(q, k, v, dtype=dtype, seed=seed, regime="ordinary", **p)


@st.composite
def lse_empty_cases(draw, *, max_len: int = 33, dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")) -> Case:
    """Cases with rows that see no key, made the ways conventions can say: bottom-right causal with
    Lq > Lk, a bottom-right window that ends before the first key, or a sequence with no keys."""
    how = draw(st.sampled_from(("causal", "causal", "window", "no_keys")))
    case = draw(convention_cases(max_len=max_len, dtypes=dtypes, softcap=False, alibi=False, causal=False,
                                 window=False, lengths_=False, regimes=("ordinary", "large")))
    s = case.shape
    rng = np.random.default_rng(case.seed + 11)
    if how == "no_keys":
        kl = rng.integers(0, s["Lk"] + 1, size=s["B"])
        kl[int(rng.integers(s["B"]))] = 0
        return case.replace(kv_lengths=kl, causal=draw(st.sampled_from((None, "bottom_right"))))
    lq = max(s["Lq"], 2)
    lk = draw(st.integers(1, lq - 1))
    q = values(rng, {**s, "Lq": lq}, case.regime, case.dtype)[0]
    params = {"causal": "bottom_right"} if how == "causal" else {"window": (draw(st.sampled_from((0, 1, 2))), 0)}
    return case.replace(q=q, k=case.k[:, :, :lk], v=case.v[:, :, :lk], **params)


@st.composite
def chunk_cases(draw, *, max_len: int = 65, dtypes: tuple[str, ...] = DTYPES, **switches) -> Case:
    """A case with chunked local attention (ATTN-CHUNK-*): chunks of 1, 2, 3 keys, a third or half of Lk, or
    more than Lk (one chunk: plain attention), either alignment, causal half the time as `cases` draws it;
    Lq != Lk half the time, so the aligned position of a query matters."""
    case = draw(cases(max_len=max_len, dtypes=dtypes, **switches))
    lk = case.shape["Lk"]
    size = draw(st.sampled_from(sorted({1, 2, 3, max(1, lk // 3), max(1, lk // 2), lk + 1})))
    return case.replace(chunk=size, window_align=draw(st.sampled_from(ALIGNMENTS)))
