"""The `flax` backend: `flax.linen.dot_product_attention` and `flax.linen.MultiHeadDotProductAttention`.

Implementations:
- `flax:linen-dpa`: `flax.linen.dot_product_attention` (flax/linen/attention.py), under `jax.jit`.
- `flax:linen-dpa-fp32-softmax`: the same function with `force_fp32_for_softmax=True`, flax's
  mixed-precision option.
- `flax:linen-mha`: `flax.linen.MultiHeadDotProductAttention` as a layer adapter (ATTN-MHA-1), whose
  default `attention_fn` is the same `dot_product_attention`.

The calling convention, read from flax/linen/attention.py (flax 0.12.8):
- BTNH layout `[batch..., length, num_heads, depth]`; the output is BTNH too.
- `mask`: True = attend; a masked logit is replaced by `jnp.finfo(dtype).min` (a finite number, not
  -inf) after the bias is added, so a row whose every key is masked gets uniform weights (the mean
  of V); a row hidden only by a -inf `bias` gets NaN.
- `bias`: added to the scaled logits, broadcast to `[batch..., num_heads, q_length, kv_length]`.
- No scale argument: the query is divided by `jnp.sqrt(depth).astype(dtype)` in the input dtype
  before Q K^T. A case's custom scale s is therefore driven through Q (adapters/prescaled.py):
  Q * (s * sqrt(Dk)), used only where that product is exact in the dtype (otherwise refused).
- No GQA (an assert requires equal head counts), no lengths arguments, no causal flag: causal
  masking and padding are expressed with flax's own helpers, `make_causal_mask` (top-left, for
  Lq = Lk), `make_attention_mask` (a pairwise comparison of query and key positions or validity
  flags) and `combine_masks`, inside the jitted call. `make_attention_mask` on validity flags hides
  a padded query row entirely, so padded query rows are fully masked rows here.
- Softmax runs in the input dtype (`force_fp32_for_softmax=False` is the default and is kept).
- Dropout: `deterministic=False`, `dropout_rate`, `dropout_rng`; the default `broadcast_dropout=True`
  shares one keep-mask across batch and heads, which contradicts ATTN-DROP-2's independence, so
  the adapter passes `broadcast_dropout=False` (recorded in `describe()`).

float64 needs `jax_enable_x64`, which `jax_common.enable_x64()` turns on when the adapters are created; the conversions,
the device lookup and the matmul-precision policy are that module's.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Literal

import numpy as np

import jax
import jax.numpy as jnp

import flax
import flax.linen as nn

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import COMPILES_PER_SHAPE, Adapter, KernelError, Result
from attnconf.adapters.jax.common import enable_x64
from attnconf.adapters.jax.adapter import jax_device, precision_context, to_jax, to_numpy
from attnconf.adapters.flax.layer import LinenMhaAdapter, first_line, framework_versions
from attnconf.adapters.jax.translate import as_4d, from_btnh, to_btnh
from attnconf.adapters.prescaled import scale_note, scale_reason, scaled_query

FRAMEWORK = "flax"
INSTALL_HINT = "pip install 'jax[cpu]' flax"
DEVICES = ("cpu", "gpu")

_DPA_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                       "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "grads", "dbias", "dropout"})


# ---- the masks, built with flax's helpers ---------------------------------------------------
def flax_mask(user_mask, q_valid, k_valid, offset, *, causal: str | None, lq: int, lk: int):
    """The one boolean mask flax receives: the case's mask AND causal AND padding, from flax's helpers.

    - top-left causal with Lq = Lk: `make_causal_mask` (what a flax decoder uses);
    - other causal: `make_attention_mask(query_pos + offset, key_pos, jnp.greater_equal)` with offset
      0 (top-left) or kv_len - q_len per batch element (bottom-right);
    - padding: `make_attention_mask(query_valid, key_valid)`, which hides a padded query's whole row.
    """
    masks = [user_mask]
    if causal == "top_left" and lq == lk:
        masks.append(nn.make_causal_mask(jnp.zeros((1, lq)), dtype=jnp.bool_))
    elif causal is not None:
        qpos = jnp.arange(lq, dtype=jnp.int32)[None, :] + offset[:, None]
        kpos = jnp.broadcast_to(jnp.arange(lk, dtype=jnp.int32), (offset.shape[0], lk))
        masks.append(nn.make_attention_mask(qpos, kpos, jnp.greater_equal, dtype=jnp.bool_))
    if q_valid is not None:
        masks.append(nn.make_attention_mask(q_valid, k_valid, dtype=jnp.bool_))
    return nn.combine_masks(*masks, dtype=jnp.bool_)


def _mask_inputs(case: Case, dev) -> tuple[Any, Any, Any, Any]:
    """(user mask, query valid, key valid, causal offset) as JAX arrays (None where unused)."""
    s = case.shape
    B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
    user = None if case.mask is None else to_jax(as_4d(case.mask), "bool", dev)
    q_valid = k_valid = None
    if case.q_lengths is not None or case.kv_lengths is not None:
        ql = np.full(B, Lq) if case.q_lengths is None else case.q_lengths
        kl = np.full(B, Lk) if case.kv_lengths is None else case.kv_lengths
        q_valid = to_jax(np.arange(Lq)[None, :] < ql[:, None], "bool", dev)
        k_valid = to_jax(np.arange(Lk)[None, :] < kl[:, None], "bool", dev)
    offset = np.zeros(B, dtype=np.int64)
    if case.causal == "bottom_right":
        ql = np.full(B, Lq) if case.q_lengths is None else case.q_lengths
        kl = np.full(B, Lk) if case.kv_lengths is None else case.kv_lengths
        offset = kl - ql
    return user, q_valid, k_valid, to_jax(offset, "int32", dev)


# ---- the jitted calls -------------------------------------------------------------------------
def _attend(fn, q, k, v, bias, user_mask, q_valid, k_valid, offset, rng, *, causal, dropout_rate):
    lq, lk = q.shape[1], k.shape[1]
    mask = flax_mask(user_mask, q_valid, k_valid, offset, causal=causal, lq=lq, lk=lk)
    kwargs: dict[str, Any] = {}
    if dropout_rate > 0:
        kwargs = dict(dropout_rng=rng, dropout_rate=dropout_rate, deterministic=False, broadcast_dropout=False)
    return fn(q, k, v, bias=bias, mask=mask, **kwargs)


def _attend_vjp(fn, q, k, v, bias, user_mask, q_valid, k_valid, offset, rng, d_out, *, causal, dropout_rate):
    def f(q, k, v, bias):
        return _attend(fn, q, k, v, bias, user_mask, q_valid, k_valid, offset, rng, causal=causal,
                       dropout_rate=dropout_rate)
    out, pull = jax.vjp(f, q, k, v, bias)
    # the cotangent has the output's dtype (float32 for half inputs under force_fp32_for_softmax)
    return out, pull(d_out.astype(out.dtype))


_STATIC = ("causal", "dropout_rate")


class LinenDpaAdapter(Adapter):
    """`flax.linen.dot_product_attention` (or any function in its `attention_fn` convention)."""

    backend = "flax"
    name = "flax:linen-dpa"
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = _DPA_CAPS
    max_head_dim = None
    example_budget = COMPILES_PER_SHAPE   # flax's own function under jax.jit: every new shape compiles (0.2 s)

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None, *,
                 fn: Callable[..., Any] | None = None, name: str | None = None):
        enable_x64()      # float64 needs it; set when an adapter is made, never at import
        super().__init__("gpu" if device == "cuda" else device)
        self.options = dict(options or {})
        self.fn = nn.dot_product_attention if fn is None else fn
        if name is not None:   # a third-party --kernel: the full count of examples
            self.name = name
            self.trusted = False
            self.example_budget = 1.0
        self._fwd = jax.jit(functools.partial(_attend, self.fn), static_argnames=_STATIC)
        self._vjp = jax.jit(functools.partial(_attend_vjp, self.fn), static_argnames=_STATIC)

    def extra_support(self, case: Case) -> Literal[True] | str:
        return scale_reason(case, self.name)

    def arguments(self, case: Case) -> tuple[tuple, dict, float]:
        dev, t = jax_device(self.device), case.dtype
        q, c = scaled_query(case)
        user, q_valid, k_valid, offset = _mask_inputs(case, dev)
        bias = None if case.bias is None else to_jax(as_4d(case.bias), t, dev)
        rng = jax.random.key(int(case.seed) % 2**32)
        args = (to_jax(to_btnh(q), t, dev), to_jax(to_btnh(case.k), t, dev), to_jax(to_btnh(case.v), t, dev),
                bias, user, q_valid, k_valid, offset, rng)
        return args, dict(causal=case.causal, dropout_rate=float(case.dropout_p)), c

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, static, c = self.arguments(case)
        notes: dict[str, Any] = scale_note(case)
        try:
            with precision_context(self.options, case.dtype):
                if grads:
                    if case.grad_out is None:
                        raise KernelError("grads requested but the case has no grad_out")
                    d_out = to_jax(to_btnh(case.grad_out), case.dtype, jax_device(self.device))
                    out, (dq, dk, dv, dbias) = self._vjp(*args, d_out, **static)
                else:
                    out = self._fwd(*args, **static)
        except KernelError:
            raise
        except Exception as exc:
            raise KernelError(f"{self.name} raised {first_line(exc)}") from exc
        if not isinstance(out, jax.Array) or out.shape != (case.shape["B"], case.shape["Lq"], case.shape["Hq"],
                                                           case.shape["Dv"]):
            raise KernelError(f"{self.name} returned {type(out).__name__} of shape {getattr(out, 'shape', None)}; "
                              f"expected BTNH {(case.shape['B'], case.shape['Lq'], case.shape['Hq'], case.shape['Dv'])}")
        res = Result(out=from_btnh(to_numpy(out)).astype(np.float64), out_dtype=str(out.dtype),
                     kernel=self.kernel_name(), notes=notes)
        if grads:
            g = {"dq": from_btnh(to_numpy(dq)).astype(np.float64) * c,
                 "dk": from_btnh(to_numpy(dk)).astype(np.float64),
                 "dv": from_btnh(to_numpy(dv)).astype(np.float64)}
            if case.bias is not None:
                g["dbias"] = to_numpy(dbias).astype(np.float64).reshape(case.bias.shape)
            res.grads = g
        return res

    def kernel_name(self) -> str:
        if self.fn is nn.dot_product_attention:
            return "flax.linen.dot_product_attention under jax.jit"
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))} under jax.jit"

    def run_raw(self, q, k, v, dtype):
        dev = jax_device(self.device)
        conv = [to_jax(np.swapaxes(np.asarray(x, dtype=np.float64), -3, -2) if np.ndim(x) >= 3 else x, dtype, dev)
                for x in (q, k, v)]
        with precision_context(self.options, dtype):
            out = self.fn(*conv)
        return np.swapaxes(to_numpy(out), -3, -2)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **framework_versions(self.device, self.options),
                "kernel": self.kernel_name(),
                "convention": "BTNH; mask True = attend (masked logits -> finfo(dtype).min); no scale argument "
                              "(query / sqrt(depth) in the input dtype): custom scales go through Q; causal and "
                              "padding via make_causal_mask / make_attention_mask / combine_masks",
                "dropout": "broadcast_dropout=False (the default True shares one keep-mask across batch and heads)",
                "force_fp32_for_softmax": False}


class LinenDpaFp32SoftmaxAdapter(LinenDpaAdapter):
    """`flax.linen.dot_product_attention(..., force_fp32_for_softmax=True)`: flax's mixed-precision option
    (its docs: "whether to force the softmax to be computed in fp32"), passed the way flax's own test
    passes it to MultiHeadDotProductAttention: `functools.partial(nn.dot_product_attention,
    force_fp32_for_softmax=True)`. The weights then stay float32, so for float16/bfloat16 inputs the
    output comes back float32, and for float64 inputs the softmax drops to float32."""

    name = "flax:linen-dpa-fp32-softmax"

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        enable_x64()      # float64 needs it; set when an adapter is made, never at import
        super().__init__(device, options, fn=functools.partial(nn.dot_product_attention, force_fp32_for_softmax=True))

    def kernel_name(self) -> str:
        return "flax.linen.dot_product_attention(force_fp32_for_softmax=True) under jax.jit"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "force_fp32_for_softmax": True}


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    from attnconf.adapters.jax.common import enable_x64

    enable_x64()

    device = "gpu" if device == "cuda" else device
    return [LinenDpaAdapter(device, options), LinenDpaFp32SoftmaxAdapter(device, options),
            LinenMhaAdapter(device, options)]


ATTENTION_FN_CONVENTION = ("query", "key", "value", "bias", "mask", "dropout_rng", "dropout_rate", "deterministic",
                           "broadcast_dropout")


def check_kernel_signature(fn: Callable[..., Any]) -> str | None:
    """None if `fn` takes flax's `attention_fn` convention (that of flax.linen.dot_product_attention)."""
    if not callable(fn):
        return f"{fn!r} is not callable"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(0, 0, 0, bias=None, mask=None, dropout_rng=None, dropout_rate=0.0, deterministic=False,
                 broadcast_dropout=False)
    except TypeError as exc:
        return (f"signature {sig} does not take flax's attention_fn convention (query, key, value, bias=, mask=, "
                f"broadcast_dropout=, dropout_rng=, dropout_rate=, deterministic=): {exc}")
    return None


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    """A third-party function in flax's `attention_fn` convention (what MultiHeadDotProductAttention calls):
    BTNH, mask True = attend, the kernel applies 1/sqrt(depth) itself."""
    from attnconf.adapters.jax.common import enable_x64

    enable_x64()
    return LinenDpaAdapter(device, {}, fn=fn, name=name)
