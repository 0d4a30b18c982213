"""Naive attention run at the precision under test: the yardstick of ATTN-TOL-1.

Emulates what a straightforward implementation in dtype t does, rounding to t
after each stage: logits, weights (softmax in float32 from the rounded logits)
and output. Every dot product is accumulated the naive way, sequentially in
float32 with one rounding per product and per addition (`np.cumsum` is
sequential; NumPy's BLAS matmul is not, and measured more accurate than
torch's CPU matmul, which made a BLAS-based yardstick flag correct kernels).

The spec fixes what is computed, not the order of operations, and correct
kernels differ exactly there (measured: torch's CPU MATH path applies
sqrt(scale) to Q and K, its CPU flash path scales the logits, flash-style
kernels normalise after P V). So the baseline is an envelope over the orders
the spec leaves open: where the scale is applied (Q, logits, sqrt(scale) on
both Q and K, fused into the float32 accumulator before the one rounding, or
upcast: the unscaled product rounded, the rest in float32)
times how rows are normalised (divide the weights, multiply by the reciprocal
of the sum, or divide the output after P V) times the order in which dot
products are summed (ascending, descending, BLAS-blocked, or tiled). The
baseline error of an element is the largest error any of these 60 naive
variants makes: a fair yardstick must not depend on an order the spec leaves
open, and one sample of rounding error is too noisy to be one.
"""
from __future__ import annotations

import hashlib
import itertools

import numpy as np

from .attention import alibi_bias, expand_kv, oracle
from .case import Case, numpy_dtype
from .shared_results import SharedResults, content_key

# "fused": the scale (and a bias) applied to the float32 accumulator and the logit rounded to t once, as a
# GEMM epilogue (cuBLAS alpha/beta, torch.baddbmm) or tinygrad's float32 logits cast to t do; in float32 it is
# the "logits" variant exactly (every step is already a float32 rounding) and reuses its numbers.
# "upcast": the unscaled product rounded to t, then cast to float32, where the scale, softcap, ALiBi and bias
# are applied and never rounded to t again (Keras' dot_product_attention on TensorFlow: einsum in t, cast,
# multiply). Also the "logits" variant exactly in float32.
SCALINGS = ("q", "logits", "sqrt", "fused", "upcast")
NORMALISATIONS = ("divide", "reciprocal", "late")
ACCUMULATIONS = ("ascending", "descending", "blas", "tiled")
LOG2E = np.float32(1.4426950408889634)
VARIANTS = tuple(itertools.product(SCALINGS, NORMALISATIONS, ACCUMULATIONS))
SMALL_PRODUCT = 1 << 15     # seq_matmul: up to this many products, one np.cumsum; above, a loop over K


def seq_matmul(a: np.ndarray, b: np.ndarray, order: str = "ascending") -> np.ndarray:
    """a @ b in float32, accumulated sequentially over the shared axis (ascending or descending
    index), by NumPy's BLAS ("blas": blocked, fused multiply-add), or "tiled": ascending for even and
    descending for odd output columns, as a tiled kernel whose edge tiles take another code path sums
    the dot products of neighbouring keys in different orders (identical keys then get logits one
    rounding apart, which a single order never shows)."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    if order == "blas":
        return np.matmul(a, b)
    k = a.shape[-1]
    out_shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
    if order == "tiled":    # each output column is its own sum: half the columns each way, not all of them twice
        out = np.empty(out_shape, np.float32)
        out[..., 0::2] = seq_matmul(a, b[..., 0::2], "ascending")
        out[..., 1::2] = seq_matmul(a, b[..., 1::2], "descending")
        return out
    if k == 0:
        return np.zeros(out_shape, np.float32)
    if int(np.prod(out_shape)) * k <= SMALL_PRODUCT:
        prod = a[..., :, :, None] * b[..., None, :, :]                            # (..., M, K, N), float32
        if order == "descending":
            prod = prod[..., ::-1, :]
        return np.cumsum(prod, axis=-2, dtype=np.float32)[..., -1, :]
    steps = range(k - 1, -1, -1) if order == "descending" else range(k)
    # the same sums, one float32 rounding per product and per addition in the same order, without the
    # (M, K, N) products: 10 to 40 times faster from about 4 x 129 x 64 x 129 on (measured)
    first, *rest = steps
    acc = a[..., :, first, None] * b[..., None, first, :]
    for j in rest:
        acc += a[..., :, j, None] * b[..., None, j, :]
    return acc


def _rounder(dtype: str):
    if dtype in ("float32", "float64"):
        return lambda x: np.asarray(x, dtype=np.float32)
    t = numpy_dtype(dtype)
    return lambda x: np.asarray(x, dtype=np.float32).astype(t).astype(np.float32)


def naive_forward(case: Case, variant: tuple[str, str, str] = ("q", "divide", "ascending"),
                  dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(output, lse) of one naive variant at `dtype` (default: the case's), as float64."""
    dtype = dtype or case.dtype
    if dtype == "float64":
        raise ValueError("there is no emulated baseline for float64; use the analytic bound")
    key = ("naive", dtype, variant)
    if key in case._cache:
        return case._cache[key]
    scaling, norm, acc = variant
    r = _rounder(dtype)
    f32 = np.float32
    hq = case.shape["Hq"]
    with np.errstate(all="ignore"):
        v = expand_kv(case.v, hq).astype(f32)
        v0 = np.where(np.isfinite(v), v, f32(0))
        p, l, m = naive_softmax_parts(case, scaling, acc, dtype)
        safe_l = np.where(l > 0, l, f32(1)).astype(f32)
        if norm == "divide":
            out = r(_value_product(case, r(np.where(l > 0, p / safe_l, f32(0))), v0, acc))
        elif norm == "reciprocal":
            out = r(_value_product(case, r(np.where(l > 0, p * (f32(1) / safe_l), f32(0))), v0, acc))
        else:
            out = r(np.where(l > 0, r(_value_product(case, r(p), v0, acc)) / safe_l, f32(0)))
        lse = r(np.where(l[..., 0] > 0, m[..., 0] + np.log(safe_l)[..., 0], -np.inf).astype(f32))
    result = (out.astype(np.float64), lse.astype(np.float64))
    case._cache[key] = result
    return result


def _value_product(case: Case, w: np.ndarray, v: np.ndarray, acc: str) -> np.ndarray:
    """seq_matmul(w, v, acc) for the case's values `v`, summed once per distinct `w`: rounded to float16 or
    bfloat16, the weights of several variants (the scale's placement, divide or reciprocal) are often the
    same numbers, and the same numbers summed in the same order give the same sums."""
    products = case._cache.setdefault(("value_products", acc), {})
    key = hashlib.blake2b(w.tobytes(), digest_size=20).digest() + f"{w.shape}".encode()
    if key not in products:
        products[key] = seq_matmul(w, v, acc)
    return products[key]


def naive_softmax_parts(case: Case, scaling: str, acc: str, dtype: str):
    """(p, l, m) in float32: unnormalised exp(s - m) of the visible logits, its row sum, the row max.

    The logits are formed with the scale applied to Q, to the logits, or as sqrt(scale) on Q and K,
    accumulated in `acc` order and rounded to `dtype`, as a naive implementation does; or "fused": the
    scale, and a bias where there is no softcap or ALiBi to come first, applied to the float32
    accumulator before the one rounding to `dtype` (the correctly rounded logit, near enough). The variants
    of SPEC section 12.5 follow, each elementwise operation rounded to `dtype` as eager code at that
    dtype rounds it:

    - softcap: `c * tanh(s / c)`, three operations (divide, tanh, multiply), each rounded;
    - ALiBi: the bias `-slope * |i + off - j|` (exact in float32 for the suite's lengths) rounded to
      `dtype` and added like any bias, the sum rounded;
    - the bias, as before; the window is visibility only (the oracle's `visible`);
    - a sink: one more logit in the row (the `dtype`-rounded sink, already so in the Case) that joins
      the row maximum and, as the last term of the sequential sum, the denominator, carrying no value.

    With a softcap, the rounded tanh (float32) is cached under ("softcap_tanh", dtype, scaling, acc)
    for the naive backward.
    """
    key = ("softmax_parts", dtype, scaling, acc)
    if key in case._cache:
        return case._cache[key]
    if scaling in ("fused", "upcast") and dtype in ("float32", "float64"):
        case._cache[key] = naive_softmax_parts(case, "logits", acc, dtype)
        if ("softcap_tanh", dtype, "logits", acc) in case._cache:      # for the naive backward
            case._cache[("softcap_tanh", dtype, scaling, acc)] = case._cache[("softcap_tanh", dtype, "logits", acc)]
        return case._cache[key]
    r = _rounder(dtype)
    f32 = np.float32
    hq = case.shape["Hq"]
    vis = oracle(case).visible
    sc = f32(case.effective_scale)
    fused_bias = scaling == "fused" and case.bias is not None and case.softcap is None and case.alibi_slopes is None
    if scaling == "upcast":          # past the product's one rounding to t, the logits stay float32
        r_logit = _rounder("float32")
    else:
        r_logit = r
    with np.errstate(all="ignore"):
        q = case.q.astype(f32)
        k = expand_kv(case.k, hq).astype(f32)
        if scaling == "q":
            s = r(_logit_product(case, dtype, scaling, acc, lambda: (r(q * sc), np.swapaxes(k, -1, -2))))
        elif scaling == "logits":
            s = r(r(_logit_product(case, dtype, scaling, acc, lambda: (q, np.swapaxes(k, -1, -2)))) * sc)
        elif scaling == "fused":
            s = _logit_product(case, dtype, "logits", acc, lambda: (q, np.swapaxes(k, -1, -2))) * sc
            if fused_bias:
                s = s + np.broadcast_to(case.bias, s.shape).astype(f32)
            s = r(s)
        elif scaling == "upcast":
            s = r_logit(r(_logit_product(case, dtype, "logits", acc, lambda: (q, np.swapaxes(k, -1, -2)))) * sc)
        else:
            root = f32(np.sqrt(case.effective_scale))
            s = r(_logit_product(case, dtype, scaling, acc, lambda: (r(q * root), np.swapaxes(r(k * root), -1, -2))))
        if case.softcap is not None:
            c = f32(case.softcap)
            y = r_logit(np.tanh(r_logit(s / c)))
            case._cache[("softcap_tanh", dtype, scaling, acc)] = y
            s = r_logit(c * y)
        if case.alibi_slopes is not None:
            ali = alibi_bias(s.shape, case.alibi_slopes, case.window_align, case.q_lengths, case.kv_lengths)
            s = r_logit(s + r_logit(ali.astype(f32)))
        if case.bias is not None and not fused_bias:
            s = r_logit(s + np.broadcast_to(case.bias, s.shape).astype(f32))
        s = np.where(vis, s, -np.inf).astype(f32)
        m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf, f32)
        if case.sinks is not None:
            sink = case.sinks.astype(f32)[None, :, None, None]
            m = np.maximum(m, sink).astype(f32)
        m = np.where(np.isneginf(m), f32(0), m).astype(f32)
        if acc == "tiled":           # flash-style kernels exponentiate in base 2: exp2(s log2 e - m log2 e)
            p = np.where(vis, np.exp2((s * LOG2E).astype(f32) - (m * LOG2E).astype(f32)), f32(0)).astype(f32)
        else:
            p = np.where(vis, np.exp(s - m), f32(0)).astype(f32)
        if case.sinks is not None:   # the sink is the row's last term: sequential sum over [p, exp(sink - m)]
            p_sink = np.broadcast_to(np.exp(sink - m), p.shape[:-1] + (1,)).astype(f32)
            l = np.cumsum(np.concatenate([p, p_sink], axis=-1), axis=-1, dtype=f32)[..., -1:]
        else:
            l = np.cumsum(p, axis=-1, dtype=f32)[..., -1:] if p.shape[-1] else np.zeros(p.shape[:-1] + (1,), f32)
    case._cache[key] = (p, l, m)
    return p, l, m


def _logit_product(case: Case, dtype: str, scaling: str, acc: str, operands) -> np.ndarray:
    """The unrounded float32 product of one scaling's logits in `acc` order, kept in the case's cache:
    the "tiled" order is the ascending sums in even key columns and the descending ones in odd, so it
    is read off the two orders' products rather than summed a third and fourth time."""
    key = ("logit_product", dtype, scaling, acc)
    if key not in case._cache:
        if acc == "tiled":
            asc = _logit_product(case, dtype, scaling, "ascending", operands)
            desc = _logit_product(case, dtype, scaling, "descending", operands)
            case._cache[key] = np.where(np.arange(asc.shape[-1]) % 2 == 0, asc, desc).astype(np.float32)
        else:
            case._cache[key] = seq_matmul(*operands(), acc)
    return case._cache[key]


# One float32 rounding unit per logit, at the magnitude of the logit's summands (SPEC section 12.1, item 5).
LOGIT_ORDER_UNITS = 1.0
U32 = 2.0 ** -24


def logit_order_error(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """First-order effect on the output and the lse of every logit erring by LOGIT_ORDER_UNITS float32
    rounding units at the magnitude of its summands, d_ij = u |scale| sum_d |q_id k_jd|:
    |dO_ie| <= sum_j P_ij d_ij |v_je - O_ie| and |dlse_i| <= sum_j P_ij d_ij (P, O: the reference's).

    The summation order of a logit's Dk products is the kernel's to choose, and the envelope samples only a
    few orders; in a row whose output hangs on the difference of two logits in the hundreds, the kernel's
    order is one more sample that can land beyond all of them (SPEC section 12.1, item 5)."""
    key = ("logit_order_error",)
    if key in case._cache:
        return case._cache[key]
    ref = oracle(case)
    hq = case.shape["Hq"]
    with np.errstate(all="ignore"):
        q = np.nan_to_num(case.q, nan=0.0, posinf=0.0, neginf=0.0)
        k = np.nan_to_num(expand_kv(case.k, hq), nan=0.0, posinf=0.0, neginf=0.0)
        v = np.nan_to_num(expand_kv(case.v, hq), nan=0.0, posinf=0.0, neginf=0.0)
        d = LOGIT_ORDER_UNITS * U32 * abs(case.effective_scale) * (np.abs(q) @ np.swapaxes(np.abs(k), -1, -2))
        w = np.where(ref.visible, np.nan_to_num(ref.weights, nan=0.0), 0.0) * d          # (B, Hq, Lq, Lk)
        out = np.nan_to_num(ref.out, nan=0.0, posinf=0.0, neginf=0.0)
        err_o = np.zeros(ref.out.shape)
        b, h, lq, lk = w.shape
        step = max(1, int(4e6 // max(1, b * h * lk * v.shape[-1])))      # rows per chunk: bounded memory
        for i in range(0, lq, step):
            dev = np.abs(v[:, :, None, :, :] - out[:, :, i:i + step, None, :])         # (B, Hq, rows, Lk, Dv)
            err_o[:, :, i:i + step] = np.einsum("bhij,bhije->bhie", w[:, :, i:i + step], dev)
        err_l = w.sum(axis=-1)
    case._cache[key] = (err_o, err_l)
    return err_o, err_l


def baseline_error(case: Case, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise max over the naive variants of |O_base - O_ref| and |lse_base - lse_ref|, and at least the
    effect of the logits' summation order (`logit_order_error`)."""
    dtype = dtype or case.dtype
    key = ("baseline_error", dtype)
    if key in case._cache:
        return case._cache[key]
    shared = _SHARED_BASELINES.get(content_key(case, dtype))
    if shared is not None:
        case._cache[key] = (shared["out"], shared["lse"])
        return case._cache[key]
    ref = oracle(case)
    finite_o, finite_l = np.isfinite(ref.out), np.isfinite(ref.lse)
    err_o = np.zeros(ref.out.shape)
    err_l = np.zeros(ref.lse.shape)
    with np.errstate(all="ignore"):
        for variant in VARIANTS:
            o, l = naive_forward(case, variant, dtype)
            eo = np.where(finite_o, np.abs(o - np.where(finite_o, ref.out, 0.0)), 0.0)
            el = np.where(finite_l, np.abs(l - np.where(finite_l, ref.lse, 0.0)), 0.0)
            err_o = np.maximum(err_o, np.where(np.isfinite(eo), eo, 0.0))
            err_l = np.maximum(err_l, np.where(np.isfinite(el), el, 0.0))
        order_o, order_l = logit_order_error(case)
        err_o = np.maximum(err_o, np.where(finite_o, order_o, 0.0))
        err_l = np.maximum(err_l, np.where(finite_l, order_l, 0.0))
    for arr in (err_o, err_l):
        arr.flags.writeable = False      # shared by every case of the same content
    case._cache[key] = (err_o, err_l)
    _SHARED_BASELINES.put(content_key(case, dtype), {"out": err_o, "lse": err_l})
    return err_o, err_l


_SHARED_BASELINES = SharedResults("baseline_error", 256 << 20)


HALF_ACCUMULATION_ORDERS = ("ascending", "descending", "pairs")
HALF_ACCUMULATION_SCALINGS = ("q", "logits")


def half_matmul(a: np.ndarray, b: np.ndarray, dtype: str, order: str = "ascending") -> np.ndarray:
    """a @ b (float32 arrays holding `dtype` values) accumulated in `dtype`: every product and every partial
    sum rounded to it, in `order` (HALF_ACCUMULATION_ORDERS: ascending, descending, or "pairs": even and
    odd terms in two running sums added at the end, which matched tf.einsum's float16 result bit for bit
    on one 8 x 96 x 8 product, though not on other shapes). float32 result."""
    if order not in HALF_ACCUMULATION_ORDERS:
        raise ValueError(f"unknown half accumulation order {order!r}; known: {', '.join(HALF_ACCUMULATION_ORDERS)}")
    r = _rounder(dtype)
    n = a.shape[-1]
    steps = range(n - 1, -1, -1) if order == "descending" else range(n)
    shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
    acc = [np.zeros(shape, np.float32) for _ in range(2)]
    for i in steps:
        lane = i % 2 if order == "pairs" else 0
        acc[lane] = r(acc[lane] + r(a[..., :, i:i + 1] * b[..., i:i + 1, :]))
    return r(acc[0] + acc[1]) if order == "pairs" else acc[0]


def half_accumulation_weights(case: Case, order: str = "ascending", scaling: str = "q") -> np.ndarray:
    """The float32 softmax weights (not yet rounded) of a naive implementation whose Q K^T accumulates in the
    case's dtype (`half_matmul` in `order`), the scale on Q before the product (`scaling="q"`) or on the
    dtype-rounded product in float32 ("logits", as Keras does), bias and visibility applied, the softmax in
    float32 as in `naive_forward`."""
    key = ("half_accumulation_weights", case.dtype, order, scaling)
    if key in case._cache:
        return case._cache[key]
    if scaling not in HALF_ACCUMULATION_SCALINGS:
        raise ValueError(f"unknown half accumulation scaling {scaling!r}; known: {', '.join(HALF_ACCUMULATION_SCALINGS)}")
    r = _rounder(case.dtype)
    f32 = np.float32
    vis = oracle(case).visible
    with np.errstate(all="ignore"):
        scale = f32(case.effective_scale)
        q = r(case.q.astype(f32) * scale) if scaling == "q" else case.q.astype(f32)
        k = expand_kv(case.k, case.shape["Hq"]).astype(f32)
        s = half_matmul(q, np.swapaxes(k, -1, -2), case.dtype, order)
        if scaling == "logits":
            s = (s * scale).astype(f32)
        if case.bias is not None:
            s = r(s + np.broadcast_to(case.bias, s.shape).astype(f32))
        s = np.where(vis, s, -np.inf).astype(f32)
        m = s.max(axis=-1, keepdims=True, initial=-np.inf)
        m = np.where(np.isneginf(m), f32(0), m).astype(f32)
        p = np.where(vis, np.exp(s - m), f32(0)).astype(f32)
        l = p.sum(axis=-1, keepdims=True, dtype=f32)
        w = np.where(l > 0, p / np.where(l > 0, l, f32(1)), f32(0)).astype(f32)
    case._cache[key] = w
    return w


def naive_forward_half_accumulation(case: Case, order: str = "ascending", scaling: str = "q") -> np.ndarray:
    """The output of a naive implementation whose dot products (Q K^T and P V) accumulate in the
    case's own dtype, rounded after every multiply and every addition (`half_matmul` in `order`), with
    the weights of `half_accumulation_weights` rounded to the dtype. Not a yardstick of the spec (which
    allows float32 accumulation): it states what "accumulates in half precision" means where a
    divergence declares it."""
    key = ("naive_half_accumulation", case.dtype, order, scaling)
    if key in case._cache:
        return case._cache[key]
    r = _rounder(case.dtype)
    f32 = np.float32
    with np.errstate(all="ignore"):
        w = r(half_accumulation_weights(case, order, scaling))
        v = expand_kv(case.v, case.shape["Hq"]).astype(f32)
        out = half_matmul(w, np.where(np.isfinite(v), v, f32(0)), case.dtype, order).astype(np.float64)
    case._cache[key] = out
    return out


def half_accumulation_error(case: Case) -> np.ndarray:
    """Elementwise max over the half-accumulating naive variants (every order of
    HALF_ACCUMULATION_ORDERS, the scale on Q or on the logits) of |O_naive - O_ref|: which order an
    implementation sums in is not observable from outside, and for short rows (Lk = 2) the error of
    one order does not bound another's element by element (measured on Keras eager)."""
    return half_accumulation_envelope(oracle(case).out, lambda o, s: naive_forward_half_accumulation(case, o, s))


def half_accumulation_envelope(ref: np.ndarray, naive) -> np.ndarray:
    """Elementwise max over HALF_ACCUMULATION_ORDERS x HALF_ACCUMULATION_SCALINGS of |naive(order, scaling)
    - ref|, non-finite differences counted as 0 (they are judged as non-finite values, not as error)."""
    err = np.zeros(ref.shape)
    with np.errstate(invalid="ignore"):
        for order in HALF_ACCUMULATION_ORDERS:
            for scaling in HALF_ACCUMULATION_SCALINGS:
                e = np.abs(naive(order, scaling) - ref)
                err = np.maximum(err, np.nan_to_num(e, nan=0.0, posinf=0.0))
    return err
