"""Masks, padding and fully-masked rows (ATTN-MASK-*, ATTN-EMPTY-*), and NaN behaviour (ATTN-NAN-*).

Masking is where kernels and the glue around them break most often: inverted
polarity, a mask applied along the wrong axis or with the wrong batch stride, a
masked value that still moves the row maximum, and the 0/0 of a row that sees
no key. Each clause is checked through the output only, so that every
implementation is held to the same statement:

- a masked position has no effect, whatever finite value it holds (ATTN-MASK-3);
- a boolean mask and the equivalent 0/-inf bias give the same result (ATTN-MASK-2);
- batch element b depends on its own mask only (ATTN-MASK-5);
- small explicit cases pin polarity, padding and their combination (ATTN-MASK-1, -4, -6);
- rows that see no key output exactly 0, and their lse is -inf (ATTN-EMPTY-1, -2).

NaN inputs are outside the conformance domain: how they propagate is recorded
(ATTN-NAN-1, -2), never failed.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as hst

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import (NoResult, clauses, expect, expect_agree, expect_close, expect_equivalent,
                                                 for_cases, lse_need, observe, run)
from attnconf.conformance.engine.scope_fit import declared_lengths
from attnconf.reference import Case, oracle, visibility


def _garbage(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Adversarial finite values: +-FINITE_MAX[dtype] and log-uniform magnitudes from 1 up to it."""
    big = st.FINITE_MAX[dtype]
    mag = np.where(rng.random(shape) < 0.3, big, 10.0 ** rng.uniform(0.0, np.log10(big), size=shape))
    return mag * rng.choice((-1.0, 1.0), size=shape)


def _reduce_all(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """AND a (B, H, Lq, Lk) bool array over the axes along which an array of `shape` is broadcast."""
    lead = x.ndim - len(shape)
    x = x.all(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.all(axis=axes, keepdims=True) if axes else x


def fill_masked(case: Case, rng: np.random.Generator) -> tuple[Case, int]:
    """The case with every masked or padded position of K, V and the bias (keys no query sees, bias
    entries masked by something else) refilled with adversarial finite values. Q is not among the
    positions ATTN-MASK-3 names, and garbage in both Q and K could overflow q.k to inf - inf."""
    s = case.shape
    b, hq, hkv, lq, lk = s["B"], s["Hq"], s["Hkv"], s["Lq"], s["Lk"]
    vis = oracle(case).visible
    key_hidden = ~vis.reshape(b, hkv, hq // hkv, lq, lk).any(axis=(2, 3))          # (B, Hkv, Lk)
    k, v = case.k.copy(), case.v.copy()
    k[key_hidden] = _garbage(rng, k[key_hidden].shape, case.dtype)
    v[key_hidden] = _garbage(rng, v[key_hidden].shape, case.dtype)
    changes = {"k": k, "v": v}
    n = int(key_hidden.sum())
    if case.bias is not None:
        others = visibility((b, hq, lq, lk), mask=case.mask, causal=case.causal, q_lengths=case.q_lengths,
                            kv_lengths=case.kv_lengths)
        free = _reduce_all(~others, case.bias.shape)
        bias = case.bias.copy()
        bias[free] = _garbage(rng, bias[free].shape, case.dtype)
        changes["bias"] = bias
        n += int(free.sum())
    if case.layout == "broadcast_kv":
        changes["layout"] = "contiguous"
    return case.replace(**changes), n


@clauses("ATTN-MASK-3", "ATTN-MASK-4", "ATTN-MASK-6")
@for_cases(st.hidden_key_cases(), weight=0.6, needs=("mask|bias|kv_lengths",))
def test_masked_positions_have_no_effect(impl, case):
    """Masked keys, padded keys and masked bias entries filled with values up to
    +-FINITE_MAX leave the output where the reference of the unfilled case puts it."""
    filled, n = fill_masked(case, np.random.default_rng(case.seed))
    if n == 0:        # nothing is hidden (a scope without masks, bias or padding): nothing to check here
        return
    assert np.array_equal(oracle(filled).out, oracle(case).out, equal_nan=True)
    res = run(impl, filled)
    if res is not None:
        expect_close(res.out, filled, impl, clause="ATTN-MASK-3")


def as_bias(case: Case) -> Case:
    """The case with its boolean mask folded into the bias: 0 (plus any bias) where True, -inf where False."""
    bias = np.zeros((1,) * 4) if case.bias is None else case.bias
    return case.replace(mask=None, bias=np.where(case.mask, bias, -np.inf))


@clauses("ATTN-MASK-2", "ATTN-MASK-1")
@for_cases(st.mask_cases(), weight=0.5, needs=("mask", "bias"))
def test_bool_mask_equals_neg_inf_bias(impl, case):
    """A boolean mask and the additive bias that is 0 where it is True and -inf where False give the same output."""
    expect_equivalent(impl, case, as_bias(case), clause1="ATTN-MASK-1", clause="ATTN-MASK-2",
                      what="bool mask vs -inf bias")


def batch_slice(case: Case, b: int) -> Case:
    """Batch element b alone, with its own mask, bias and lengths."""
    B = case.shape["B"]

    def cut(x):
        return x[b:b + 1] if x is not None and x.ndim == 4 and x.shape[0] == B else x

    return case.replace(q=case.q[b:b + 1], k=case.k[b:b + 1], v=case.v[b:b + 1], mask=cut(case.mask),
                        bias=cut(case.bias), grad_out=None,
                        q_lengths=None if case.q_lengths is None else case.q_lengths[b:b + 1],
                        kv_lengths=None if case.kv_lengths is None else case.kv_lengths[b:b + 1])


@clauses("ATTN-MASK-5", "ATTN-MASK-4")
@for_cases(st.per_batch_mask_cases(), weight=0.4, needs=("mask|bias|kv_lengths|q_lengths",))
def test_per_batch_masks(impl, case):
    """With masks, biases or lengths that differ across the batch (the strategy makes batch element 1
    differ from 0), batch element 1's rows equal the run of batch element 1 alone."""
    full = run(impl, case)
    jf = expect_close(full.out, case, impl, clause="ATTN-MASK-5")
    one = batch_slice(case, 1)
    res = run(impl, one)
    jb = expect_close(res.out, one, impl, clause="ATTN-MASK-5")
    expect_agree(full.out[1:2], jf, res.out, jb, gap=0.0, clause="ATTN-MASK-5",
                 what="batch element 1 in the batch vs alone", case=case, impl=impl)


# ---- explicit small cases ---------------------------------------------------------

def _perm_mask() -> np.ndarray:
    m = np.zeros((4, 4), dtype=bool)
    m[np.arange(4), [2, 0, 3, 1]] = True       # row i attends to exactly one key: out[i] = V[perm[i]]
    return m


_KEY_PAD = np.array([[True, True, False, True, False], [False, True, True, True, True]])[:, None, None, :]
POLARITY = [
    st.fixed_case(21, Lq=4, Lk=4, mask=_perm_mask()),
    st.fixed_case(22, B=2, Lq=5, Lk=5, mask=_KEY_PAD),
    st.fixed_case(23, Hq=1, Lq=3, Lk=6, dtype="bfloat16", mask=np.tri(3, 6, 2, dtype=bool)),
]
PADDING = [
    st.fixed_case(24, B=3, Lq=4, Lk=5, kv_lengths=[1, 3, 5]),
    st.fixed_case(25, B=3, Lq=4, Lk=5, dtype="float16", kv_lengths=[5, 2, 3], q_lengths=[4, 2, 0]),
    st.fixed_case(26, B=2, Lq=3, Lk=4, kv_lengths=[0, 4]),
]
_BIAS = np.where(np.random.default_rng(27).random((2, 1, 5, 7)) < 0.2, -np.inf, 1.5)
COMBINED = [
    st.fixed_case(27, B=2, Lq=5, Lk=7, mask=np.random.default_rng(28).random((2, 1, 5, 7)) < 0.7, bias=_BIAS,
                  causal="bottom_right", kv_lengths=[6, 7], q_lengths=[5, 3]),
    st.fixed_case(29, Lq=6, Lk=6, dtype="float64", mask=np.eye(6, dtype=bool) | (np.arange(6) % 2 == 0),
                  bias=np.linspace(-2, 2, 36).reshape(6, 6), causal="top_left"),
]


@clauses("ATTN-MASK-1")
@for_cases(st.fixed_cases(POLARITY), examples=POLARITY, weight=0.04, dtypes=None)
def test_mask_polarity(impl, case):
    """True means "may attend": a one-key-per-row mask picks that key's value; key-padding masks
    of shape (B, 1, 1, Lk) hide keys, not queries."""
    case = declared_lengths(case, impl, frozenset())    # into a narrow kernel's declared limits, if any
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-MASK-1")


@clauses("ATTN-MASK-4")
@for_cases(st.fixed_cases(PADDING), examples=PADDING, weight=0.04, dtypes=None)
def test_padding_lengths(impl, case):
    """kv_lengths hide trailing keys per batch element; q_lengths empty trailing rows; lengths may be 0."""
    case = declared_lengths(case, impl, frozenset())    # into a narrow kernel's declared limits, if any
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-MASK-4")


@clauses("ATTN-MASK-6")
@for_cases(st.fixed_cases(COMBINED), examples=COMBINED, weight=0.04, dtypes=None)
def test_mask_combination(impl, case):
    """Mask, bias (with -inf), causal alignment and padding all restrict visibility together."""
    case = declared_lengths(case, impl, frozenset())    # into a narrow kernel's declared limits, if any
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-MASK-6")


# ---- fully-masked rows ----------------------------------------------------------------

EMPTY_PINS = [st.fixed_case(30, B=2, Lq=6, Lk=3, causal="bottom_right"),
              st.fixed_case(31, Lq=4, Lk=4, bias=np.where(np.arange(4)[:, None] == 2, -np.inf, np.zeros((4, 4))))]


@clauses("ATTN-EMPTY-1", "ATTN-EMPTY-2", "ATTN-CAUSAL-3")
@for_cases(st.empty_row_cases(), examples=EMPTY_PINS, weight=0.6,
           needs=("mask|bias|q_lengths|kv_lengths|causal_bottom_right",))
def test_fully_masked_rows_are_zero(impl, case):
    """A row with no visible key (mask row, -inf bias row, query padding, kv_len 0, bottom-right
    causal with Lq > Lk) outputs exactly 0; its lse is -inf where the kernel returns lse."""
    empty = ~oracle(case).visible.any(axis=-1)
    assert empty.any()
    res = run(impl, case, need=lse_need(impl, case))
    bad = np.argwhere(empty & ~(res.out == 0).all(axis=-1))
    if bad.size:
        first = tuple(int(i) for i in bad[0])
        expect(False, "ATTN-EMPTY-1", f"{len(bad)} of {int(empty.sum())} fully-masked rows are not exactly 0; "
               f"first at {first}: {res.out[first][:4]}", case, impl)
    if res.lse is not None:
        lbad = np.argwhere(empty & ~np.isneginf(res.lse))
        if lbad.size:
            first = tuple(int(i) for i in lbad[0])
            expect(False, "ATTN-EMPTY-2", f"lse of fully-masked row {first} is {res.lse[first]}, not -inf", case, impl)
    if res.weights is not None:
        expect(bool((res.weights[empty] == 0).all()), "ATTN-EMPTY-2", "a fully-masked row has a nonzero weight",
               case, impl)
    expect_close(res.out, case, impl)


# ---- NaN behaviour: recorded, never failed ------------------------------------------------

NAN_DTYPES = ("float32",)


def _nan_outcome(impl, case: Case, affected: np.ndarray) -> str | None:
    """How NaN showed up: in the affected rows (B, Hq, Lq bool) and elsewhere."""
    try:
        res = run(impl, case)
    except NoResult:          # recorded (unsupported, or raised as declared): nothing to observe
        return None
    except Exception as exc:  # a kernel that raises on NaN input (or on this mask) is recorded too
        return f"kernel error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    nan_rows = np.isnan(res.out).any(axis=-1)
    hit, n = int((nan_rows & affected).sum()), int(affected.sum())
    leaked = int((nan_rows & ~affected).sum())
    if n == 0:
        return "masked NaN stays out" if leaked == 0 else f"NaN reaches {leaked} of {nan_rows.size} rows"
    if hit == n:
        text = "nan propagates"
    elif hit == 0:
        text = "finite output (NaN lost)" if np.isfinite(res.out[affected]).all() else "inf, not NaN"
    else:
        text = f"partial: NaN in {hit} of {n} affected rows"
    return text + (f"; NaN leaks into {leaked} unaffected row(s)" if leaked else "")


def _nan_case(dtype: str, where: str, **params) -> tuple[Case, np.ndarray]:
    base = st.fixed_case(40, Hq=1, Lq=4, Lk=6, Dk=8, dtype=dtype, **params)
    q, k, v = base.q.copy(), base.k.copy(), base.v.copy()
    bias = None if base.bias is None else base.bias.copy()
    if where == "q":
        q[0, 0, 1, :3] = np.nan
    elif where == "k":
        k[0, 0, 5, 0] = np.nan
    elif where == "v":
        v[0, 0, 5, :] = np.nan
    elif where == "bias":
        bias = np.zeros((4, 6)) if bias is None else bias
        bias[1, 5] = np.nan
    case = Case.build(q, k, v, **{**{f: getattr(base, f) for f in ("mask", "causal", "q_lengths", "kv_lengths")},
                                   "dtype": dtype, "seed": base.seed, "bias": bias})
    vis = oracle(base.replace(bias=None if bias is None else np.where(np.isnan(bias), 0.0, bias))).visible
    if where == "q":
        affected = np.zeros(vis.shape[:3], bool)
        affected[0, 0, 1] = vis[0, 0, 1].any()
    elif where == "bias":
        affected = np.zeros(vis.shape[:3], bool)
        affected[0, 0, 1] = vis[0, 0, 1, 5]
    else:
        affected = vis[..., 5]
    return case, affected


@clauses("ATTN-NAN-1")
def test_nan_in_attended_input_is_recorded(impl):
    """Recorded: a NaN in the query row, a visible key, its value or a visible bias entry; does it reach the row?"""
    for dtype in NAN_DTYPES:
        for where, label in (("q", "query row"), ("k", "key"), ("v", "value"), ("bias", "bias entry")):
            case, affected = _nan_case(dtype, where)
            outcome = _nan_outcome(impl, case, affected)
            if outcome is not None:
                observe(impl, "ATTN-NAN-1", f"{dtype}: NaN in an attended {label}", outcome, case)


@clauses("ATTN-NAN-2")
def test_nan_at_masked_position_is_recorded(impl):
    """Recorded: a NaN in K, V or the bias at a key no query sees, or in a padded query row; does it leak?"""
    column = (np.arange(6) != 5)[None, None, None, :]
    hidden = {"bool mask": dict(mask=column), "kv_lengths": dict(kv_lengths=[5]),
              "-inf bias": dict(bias=np.where(column, 0.0, -np.inf))}
    for dtype in NAN_DTYPES:
        for how, params in hidden.items():
            for where in ("k", "v") + (("bias",) if how == "bool mask" else ()):
                case, _ = _nan_case(dtype, where, **params)
                outcome = _nan_outcome(impl, case, np.zeros(case.out_shape[:3], bool))
                if outcome is not None:
                    observe(impl, "ATTN-NAN-2", f"{dtype}: NaN in {where} at a key hidden by {how}",
                            outcome, case)
        case, _ = _nan_case(dtype, "q", q_lengths=[1])
        outcome = _nan_outcome(impl, case, np.zeros(case.out_shape[:3], bool))
        if outcome is not None:
            observe(impl, "ATTN-NAN-2", f"{dtype}: NaN in a padded query row",
                    outcome, case)
