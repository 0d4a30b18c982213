"""Third-party JAX kernels (`--backend=jax --kernel=MODULE:ATTR`).

A JAX kernel takes the `jax.nn.dot_product_attention` convention:

    fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
       query_seq_lengths=None, key_value_seq_lengths=None) -> array

in BTNH layout (batch, length, heads, head dim), mask True = attend, bias added.
The wrapper reuses `CallableAdapter`'s mutation and return-type checks and only
changes how arguments are built and how the BTNH output comes back.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from attnconf.reference import Case

from .base import KernelError, Result
from .callable import CallableAdapter
from .jax_common import enable_x64, jax_device, to_jax, to_numpy
from .jax_translate import translate

JAX_CONVENTION = ("query", "key", "value", "bias", "mask", "scale", "is_causal",
                  "query_seq_lengths", "key_value_seq_lengths")
KERNEL_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                         "gqa", "custom_scale", "cross", "mask_with_causal", "dv_ne_dk"})


class JaxCallableAdapter(CallableAdapter):
    """A `jax.nn.dot_product_attention`-convention callable as an adapter."""

    def __init__(self, fn: Callable[..., Any], *, name: str, device: str = "cpu"):
        super().__init__(fn, backend="jax", name=name, device=device,
                         to_array=lambda x, dtype: to_jax(x, dtype, jax_device(device)),
                         to_numpy=to_numpy, dtype_name=lambda a: str(a.dtype),
                         capabilities=KERNEL_CAPS)
        enable_x64()

    def arguments(self, case: Case) -> tuple[tuple, dict]:
        call = translate(case)
        t = case.dtype
        args = tuple(self._to_array(x, t) for x in (call.q, call.k, call.v))
        kwargs: dict[str, Any] = dict(scale=call.scale, is_causal=call.is_causal)
        # Only pass what the case uses, so kernels with a narrower signature still run plain cases.
        if call.bias is not None:
            kwargs["bias"] = self._to_array(call.bias, t)
        if call.mask is not None:
            kwargs["mask"] = self._to_array(call.mask, "bool")
        if call.q_lengths is not None:
            kwargs["query_seq_lengths"] = self._to_array(call.q_lengths, "int32")
        if call.kv_lengths is not None:
            kwargs["key_value_seq_lengths"] = self._to_array(call.kv_lengths, "int32")
        return args, kwargs

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, kwargs = self.arguments(case)
        out, dtype = self.convert(self.call(args, kwargs))
        s = case.shape
        want = (s["B"], s["Lq"], s["Hq"], s["Dv"])
        if out.shape != want:
            raise KernelError(f"kernel returned shape {out.shape}; expected BTNH {want}")
        return Result(out=np.swapaxes(out, 1, 2), out_dtype=dtype, kernel=self.name)

    def run_raw(self, q, k, v, dtype):
        conv = [self._to_array(np.swapaxes(np.asarray(x, dtype=np.float64), -3, -2), dtype) for x in (q, k, v)]
        return np.swapaxes(self._to_numpy(self.fn(*conv)), -3, -2)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "calling_convention": "jax.nn.dot_product_attention (BTNH)"}


def check_jax_signature(fn: Callable[..., Any]) -> str | None:
    """None if `fn` accepts the JAX convention, else a one-line reason."""
    if not callable(fn):
        return f"{fn!r} is not callable"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # no introspectable signature: let the calls tell
    try:
        sig.bind(0, 0, 0, bias=None, mask=None, scale=None, is_causal=False,
                 query_seq_lengths=None, key_value_seq_lengths=None)
    except TypeError as exc:
        return (f"signature {sig} does not take the jax.nn.dot_product_attention convention "
                f"(query, key, value, bias=, mask=, *, scale=, is_causal=, query_seq_lengths=, "
                f"key_value_seq_lengths=): {exc}")
    return None
