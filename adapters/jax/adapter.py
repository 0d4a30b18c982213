"""The `jax` backend: `jax.nn.dot_product_attention` (xla and cudnn) and flax's MultiHeadAttention.

Instantiating an adapter enables `jax_enable_x64` (importing this module changes
no setting) so that float64 cases really run in float64: without it JAX silently
computes float64 inputs in float32. `describe()` records the flag. float32
matmuls run at precision 'highest' unless the suite was invoked with
--allow-tf32, because JAX on GPU otherwise uses TF32/bf16 passes for float32
and the test would certify a lower precision than the dtype claims.

`jax:cudnn` raises instead of falling back when cuDNN cannot run a case; each
shape class is probed once (lower + compile) and the raise becomes the
unsupported reason. A case counts as run by cuDNN only if the compiled HLO
contains a `__cudnn$fmha` custom call.
"""
from __future__ import annotations

import contextlib
import re

from typing import Any, Callable, Literal

import numpy as np

import jax


from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES, HALF_DTYPES

from attnconf.adapters.base import COMPILES_PER_SHAPE, Adapter, KernelError, Result
from attnconf.adapters.jax.common import enable_x64, jax_device, precision_context, to_jax, to_numpy
from attnconf.adapters.jax.translate import JaxCall, from_btnh, translate

CUDNN_MARK = "__cudnn$fmha"

_SDPA_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                        "gqa", "custom_scale", "cross", "mask_with_causal"})


def _attend(q, k, v, bias, mask, q_len, kv_len, *, is_causal, scale, implementation, residual):
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
        query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
        implementation=implementation, return_residual=residual)


_STATIC = ("is_causal", "scale", "implementation", "residual")
_attend_jit = jax.jit(_attend, static_argnames=_STATIC)


def _vjp_fn(q, k, v, bias, mask, q_len, kv_len, d_out, *, is_causal, scale, implementation, residual):
    """(out, lse or None, (dq, dk, dv, dbias)): with `residual` the lse rides along undifferentiated, so a
    gradient case compiles one program for its forward and backward."""
    def f(q, k, v, bias):
        r = _attend(q, k, v, bias, mask, q_len, kv_len, is_causal=is_causal, scale=scale,
                    implementation=implementation, residual=residual)
        return r if residual else (r, None)
    out, pull, lse = jax.vjp(f, q, k, v, bias, has_aux=True)
    return out, lse, pull(d_out)


_vjp_jit = jax.jit(_vjp_fn, static_argnames=_STATIC)
# float16 on CPU: the same function, jitted only under _trace_time_fallback (its own trace cache)
_attend_f16_cpu = jax.jit(_attend, static_argnames=_STATIC)
F16_VERIFY_FIRST, F16_VERIFY_EVERY = 2, 64


class _EinsumRefusingF16F32:
    """Stands in for the einsum module of `jax.nn`'s attention while jit traces it on CPU: an einsum
    asking for DotAlgorithmPreset.F16_F16_F32 raises at once, as its compilation does when the call
    runs op by op, so jax's own `except` branch (precision=None) is what gets traced."""

    def __init__(self, real: Any):
        self.real = real

    def einsum(self, *args, precision=None, **kwargs):
        if precision == jax.lax.DotAlgorithmPreset.F16_F16_F32:
            raise ValueError("The precision 'F16_F16_F32' is not supported by dot_general on CPU")
        return self.real.einsum(*args, precision=precision, **kwargs)


@contextlib.contextmanager
def _trace_time_fallback():
    """Yields False (nothing replaced) where this JAX's attention holds no `jnp_einsum` module."""
    from jax._src.nn import functions as nn_functions

    real = getattr(nn_functions, "jnp_einsum", None)
    if real is None or not hasattr(real, "einsum"):
        yield False
        return
    nn_functions.jnp_einsum = _EinsumRefusingF16F32(real)
    try:
        yield True
    finally:
        nn_functions.jnp_einsum = real


class JaxSdpaAdapter(Adapter):
    """Shared machinery of the `jax.nn.dot_product_attention` implementations."""

    backend = "jax"
    implementation: str = "xla"
    bias_full_length = False   # cuDNN needs the bias with full (Lq, Lk) extents

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        super().__init__("gpu" if device == "cuda" else device)
        self.options = dict(options or {})
        enable_x64()
        self._f16_compiled_ok, self._f16_calls, self._f16_verified = True, 0, 0

    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        reason = _value_width_reason(case)
        return reason if reason is not True else super().supports(case, need=need)

    # -- argument building ----------------------------------------------
    def jax_arguments(self, case: Case, call: JaxCall) -> tuple[tuple, dict]:
        dev, t = jax_device(self.device), case.dtype
        s = case.shape
        bias, mask = call.bias, call.mask
        if self.bias_full_length:
            if bias is not None:
                bias = np.broadcast_to(bias, bias.shape[:2] + (s["Lq"], s["Lk"]))
            if mask is not None:
                mask = np.broadcast_to(mask, mask.shape[:2] + (s["Lq"], s["Lk"]))
        args = (to_jax(call.q, t, dev), to_jax(call.k, t, dev), to_jax(call.v, t, dev),
                to_jax(bias, t, dev), to_jax(mask, "bool", dev),
                to_jax(call.q_lengths, "int32", dev), to_jax(call.kv_lengths, "int32", dev))
        static = dict(is_causal=call.is_causal, scale=call.scale, implementation=self.implementation)
        return args, static

    def hlo_text(self, case: Case, *, residual: bool = False) -> str:
        """The compiled HLO of the forward call for `case`."""
        args, static = self.jax_arguments(case, translate(case))
        with precision_context(self.options, case.dtype):
            return _attend_jit.lower(*args, **static, residual=residual).compile().as_text()

    # -- running ----------------------------------------------------------
    def run(self, case: Case, *, grads: bool = False) -> Result:
        call = translate(case)
        args, static = self.jax_arguments(case, call)
        want_lse = "lse" in self.capabilities
        notes: dict[str, Any] = {"translation": call.notes} if call.notes else {}
        try:
            with precision_context(self.options, case.dtype):
                if grads and not self.eager(case):
                    out, lse, g = self._backward(case, args, static, residual=want_lse)
                else:
                    out, lse = self._forward(args, static, want_lse, case, notes)
                    g = self._backward(case, args, static)[2] if grads else None
        except KernelError:
            raise
        except Exception as exc:
            raise KernelError(f"{self.name} raised {type(exc).__name__}: {_first_line(exc)}") from exc
        res = Result(out=from_btnh(to_numpy(out)).astype(np.float64), out_dtype=str(out.dtype),
                     kernel=self.kernel_name(case), notes=notes)
        if lse is not None:
            res.lse = np.swapaxes(to_numpy(lse), 1, 2).astype(np.float64)
            res.notes["lse_dtype"] = str(lse.dtype)
        if g is not None:
            res.grads = g
        return res

    def eager(self, case: Case) -> bool:
        """float16 cannot run under jit: JAX asks for the explicit F16_F16_F32 dot algorithm, which
        fails at compile time on CPU and, for small shapes, on an H100 ("Unsupported dot precision
        algorithm"), and its fallback only catches the error when ops run eagerly. jax:cudnn is
        exempt: its fused call has no such dot."""
        return case.dtype == "float16" and self.implementation == "xla"

    def _forward(self, args, static, want_lse, case: Case, notes: dict[str, Any]):
        if not self.eager(case):
            return _split(_attend_jit(*args, **static, residual=want_lse), want_lse)
        notes["eager"] = "float16 runs op by op, as it must: under jax.jit it raises (F16_F16_F32 unsupported)"
        if self.device != "cpu" or not self._f16_compiled_ok:
            return _split(_attend(*args, **static, residual=want_lse), want_lse)
        return self._forward_f16_cpu(args, static, want_lse, notes)

    def _forward_f16_cpu(self, args, static, want_lse, notes: dict[str, Any]):
        """float16 on CPU, forward: what users get is the op-by-op call, whose first einsum fails to
        compile and falls back to the default precision. Compiling that same fallback graph (traced
        with the einsum refusing F16_F16_F32 at once) is about 5x faster per new shape; the first
        F16_VERIFY_FIRST calls and every F16_VERIFY_EVERY-th also run op by op and must agree bit for
        bit, else the adapter runs op by op from then on (both facts are in the result's notes)."""
        try:
            with _trace_time_fallback() as replaced:
                fast = _attend_f16_cpu(*args, **static, residual=want_lse) if replaced else None
        except Exception:   # the op-by-op call below says what the user would see
            fast = None
        if fast is None:
            self._f16_compiled_ok = False
            return _split(_attend(*args, **static, residual=want_lse), want_lse)
        n, self._f16_calls = self._f16_calls, self._f16_calls + 1
        if n < F16_VERIFY_FIRST or n % F16_VERIFY_EVERY == 0:
            slow = _attend(*args, **static, residual=want_lse)
            same = all(np.array_equal(to_numpy(a), to_numpy(b), equal_nan=True)
                       for a, b in zip(jax.tree_util.tree_leaves(fast), jax.tree_util.tree_leaves(slow)))
            self._f16_verified += same
            if not same:
                self._f16_compiled_ok = False
                notes["eager"] += ("; the compiled fallback graph differed from the op-by-op call here, "
                                   "so every later float16 call runs op by op")
                return _split(slow, want_lse)
        notes["eager"] = ("float16 on CPU: forward is jax's own fallback graph (precision=None einsum), "
                          f"compiled; bitwise equal to the op-by-op call on all {self._f16_verified} calls "
                          "compared so far; gradients run op by op")
        return _split(fast, want_lse)

    def _backward(self, case: Case, args, static, *, residual: bool = False):
        """(out, lse or None, gradients): op by op where the forward must be (float16 on CPU), else jitted,
        forward and backward in one program (one compile per new shape, not two)."""
        if case.grad_out is None:
            raise KernelError("grads requested but the case has no grad_out")
        d_out = to_jax(np.swapaxes(case.grad_out, 1, 2), case.dtype, jax_device(self.device))
        fn = _vjp_fn if self.eager(case) else _vjp_jit
        out, lse, (dq, dk, dv, dbias) = fn(*args, d_out, **static, residual=residual)
        g = {"dq": from_btnh(to_numpy(dq)), "dk": from_btnh(to_numpy(dk)), "dv": from_btnh(to_numpy(dv))}
        if case.bias is not None and "dbias" in self.capabilities:
            g["dbias"] = to_numpy(dbias).reshape(case.bias.shape)
        return out, lse, {n: np.asarray(x, dtype=np.float64) for n, x in g.items()}

    def kernel_name(self, case: Case) -> str:
        return f"jax.nn.dot_product_attention(implementation={self.implementation!r})"

    def run_raw(self, q, k, v, dtype):
        dev = jax_device(self.device)
        qj, kj, vj = (to_jax(np.swapaxes(np.asarray(x, dtype=np.float64), -3, -2) if np.ndim(x) >= 3 else x,
                             dtype, dev) for x in (q, k, v))
        with precision_context(self.options, dtype):
            out = jax.nn.dot_product_attention(qj, kj, vj, implementation=self.implementation)
        return np.swapaxes(to_numpy(out), -3, -2)

    def describe(self) -> dict[str, Any]:
        import jaxlib

        d = {**super().describe(), "framework": "jax", "version": jax.__version__,
             "jaxlib": jaxlib.__version__, "jax_enable_x64": bool(jax.config.jax_enable_x64),
             "matmul_precision": "default (allow_tf32)" if self.options.get("allow_tf32") else "highest",
             "kernel": f"jax.nn.dot_product_attention(implementation={self.implementation!r}) under jax.jit",
             "float16": "op by op (under jit it raises); on CPU the forward runs jax's own fallback graph "
                        "compiled, checked bit for bit against the op-by-op call"}
        try:
            d["jax_device"] = str(jax_device(self.device))
        except KernelError as exc:
            d["jax_device"] = str(exc)
        try:
            import flax

            d["flax"] = flax.__version__
        except ImportError:
            d["flax"] = None
        return d


class XlaAdapter(JaxSdpaAdapter):
    """`implementation='xla'`: the reference-style XLA graph (softmax always in float32)."""

    name = "jax:xla"
    implementation = "xla"
    # every new shape compiles under jit (0.17-0.19 s each on CPU, measured); the thorough profile
    # scales the count back up
    example_budget = COMPILES_PER_SHAPE
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = _SDPA_CAPS | {"grads", "dbias", "lse"}
    max_head_dim = None



class CudnnAdapter(JaxSdpaAdapter):
    """`implementation='cudnn'`: cuDNN fused attention; raises where cuDNN cannot run."""

    name = "jax:cudnn"
    implementation = "cudnn"
    devices = ("gpu",)
    dtypes = HALF_DTYPES
    capabilities = _SDPA_CAPS
    max_head_dim = 256   # Hopper; 128 before Hopper (the probe says which)
    bias_full_length = True
    _probe_cache: dict[tuple, tuple[str | None, str]] = {}

    def extra_support(self, case: Case) -> Literal[True] | str:
        if case.shape["Dk"] % 8:
            return f"{self.name} needs head dim a multiple of 8; got {case.shape['Dk']}"
        return self._probe(case)[0] or True

    @staticmethod
    def _shape_class(case: Case) -> tuple:
        call = translate(case)
        return (case.q.shape, case.k.shape, case.v.shape, case.dtype, call.is_causal, case.scale,
                None if call.bias is None else call.bias.shape[:2],
                None if call.mask is None else call.mask.shape[:2],
                call.q_lengths is not None, call.kv_lengths is not None)

    def _probe(self, case: Case) -> tuple[str | None, str]:
        """(None, fmha targets) if cuDNN compiles this shape class, else (why not, ""); cached."""
        key = (self._shape_class(case), bool(self.options.get("allow_tf32")))
        if key in self._probe_cache:
            return self._probe_cache[key]
        try:
            text = self.hlo_text(case)
        except Exception as exc:  # JAX raises NotImplementedError/ValueError for what cuDNN cannot run
            result = (f"{self.name} refuses this case: {type(exc).__name__}: {_first_line(exc)}", "")
        else:
            marks = sorted({m.group(0) for m in re.finditer(r"__cudnn\$fmha\w*", text)})
            result = ((None, ",".join(marks)) if marks else
                      (f"{self.name}: compiled HLO has no {CUDNN_MARK} custom call (not the cuDNN kernel)", ""))
        self._probe_cache[key] = result
        return result

    def kernel_name(self, case: Case) -> str:
        reason, marks = self._probe(case)
        if reason:
            raise KernelError(reason)
        return f"cuDNN custom call {marks}"


def _split(result, want_lse: bool):
    return result if want_lse else (result, None)


def _value_width_reason(case: Case) -> Literal[True] | str:
    s = case.shape
    if s["Dv"] != s["Dk"]:
        return "jax.nn.dot_product_attention requires value's head dim to equal key's (raises ValueError)"
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    """jax:xla everywhere, jax:cudnn on GPU, jax:flax-mha where flax is installed."""
    import importlib.util

    device = "gpu" if device == "cuda" else device
    adapters: list[Adapter] = [XlaAdapter(device, options)]
    if device == "gpu":
        adapters.append(CudnnAdapter(device, options))
    if importlib.util.find_spec("flax") is not None:
        from attnconf.adapters.jax.layer import FlaxMhaAdapter

        adapters.append(FlaxMhaAdapter(device, options))
    return adapters


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    from attnconf.adapters.jax.kernel import JaxCallableAdapter

    return JaxCallableAdapter(fn, name=name, device="gpu" if device == "cuda" else device)


def check_kernel_signature(fn: Callable[..., Any]) -> str | None:
    """None if `fn` takes the jax.nn.dot_product_attention convention, else a one-line reason."""
    from attnconf.adapters.jax.kernel import check_jax_signature

    return check_jax_signature(fn)
