"""Third-party JAX kernels (`--backend=jax --kernel=MODULE:ATTR`).

A JAX kernel takes the `jax.nn.dot_product_attention` convention:

    fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
       query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None) -> array

in BTNH layout (batch, length, heads, head dim), mask True = attend, bias added.
The wrapper reuses `CallableAdapter`'s mutation and return-type checks and only
changes how arguments are built and how the BTNH output comes back.

Windows: `local_window_size=(left, right)` keeps keys `i - left <= j <= i + right`
(jax/_src/nn/functions.py `_get_window_mask`), the spec's window aligned top-left
(`window_top_left`). A bottom-right window whose offset is 0 in every batch element
is the same window and is passed the same way; other bottom-right windows are
outside the convention (unsupported). Only a case with a window passes the keyword,
so kernels with a narrower signature still run the other cases.

Gradients (`grads`, `dbias`): dq, dk, dv (and dbias when the case has a bias) are
`jax.vjp` of the kernel with respect to query, key, value (and bias), pulled back
with the case's grad_out, so a kernel's own `custom_vjp` is what is judged. A
forward-only kernel declares `{"grads": False}`; one whose backward has no bias
gradient leaves "dbias" out of its declared features (the bias is then a constant).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from attnconf.reference import Case

from attnconf.adapters.base import KernelError, NotSupported, Result
from attnconf.adapters.callable import CallableAdapter
from attnconf.adapters.contract import is_refusal
from attnconf.adapters.jax.common import enable_x64, jax_device, to_jax, to_numpy
from attnconf.adapters.jax.translate import from_btnh, translate, window_is_top_left

JAX_CONVENTION = ("query", "key", "value", "bias", "mask", "scale", "is_causal",
                  "query_seq_lengths", "key_value_seq_lengths", "local_window_size")
KERNEL_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                         "gqa", "custom_scale", "cross", "mask_with_causal", "dv_ne_dk", "window_top_left",
                         "grads", "dbias"})


class JaxCallableAdapter(CallableAdapter):
    """A `jax.nn.dot_product_attention`-convention callable as an adapter."""

    def __init__(self, fn: Callable[..., Any], *, name: str, device: str = "cpu"):
        super().__init__(fn, backend="jax", name=name, device=device,
                         to_array=lambda x, dtype: to_jax(x, dtype, jax_device(device)),
                         to_numpy=to_numpy, dtype_name=lambda a: str(a.dtype),
                         capabilities=KERNEL_CAPS)
        enable_x64()

    def arguments(self, case: Case, *, grads: bool = False) -> tuple[tuple, dict]:
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
        if call.local_window_size is not None:
            kwargs["local_window_size"] = tuple(int(w) for w in call.local_window_size)
        return args, kwargs

    def requirements(self, case: Case) -> set[str]:
        """Case.features(), with a bottom-right window whose offset is 0 everywhere named top-left:
        it is the same window, and `local_window_size` says it."""
        f = set(case.features())
        if "window_bottom_right" in f and window_is_top_left(case):
            f.discard("window_bottom_right")
            f.add("window_top_left")
        return f

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, kwargs = self.arguments(case)
        out, dtype = self.convert(self.call(args, kwargs))
        s = case.shape
        want = (s["B"], s["Lq"], s["Hq"], s["Dv"])
        if out.shape != want:
            raise KernelError(f"kernel returned shape {out.shape}; expected BTNH {want}")
        res = Result(out=np.swapaxes(out, 1, 2), out_dtype=dtype, kernel=self.name)
        if grads:
            res.grads = self.gradients(case, args, kwargs, want)
        return res

    def gradients(self, case: Case, args: tuple, kwargs: dict, want: tuple[int, ...]) -> dict[str, np.ndarray]:
        """dq, dk, dv (and dbias) in the spec's layout: `jax.vjp` of the kernel, pulled back with grad_out."""
        import jax

        if case.grad_out is None:
            raise KernelError("grads requested but the case has no grad_out")
        with_bias = "bias" in kwargs and "dbias" in self.capabilities
        rest = {n: a for n, a in kwargs.items() if not (with_bias and n == "bias")}
        fn = self.fn

        def f(q, k, v, *bias):
            return fn(q, k, v, **rest, **({"bias": bias[0]} if bias else {}))

        primals = tuple(args) + ((kwargs["bias"],) if with_bias else ())
        try:
            out, pull = jax.vjp(f, *primals)
            if not isinstance(out, jax.Array) or out.shape != want:
                raise KernelError(f"kernel under jax.vjp returned {type(out).__name__} "
                                  f"{getattr(out, 'shape', '')}; expected a BTNH array {want}")
            d_out = self._to_array(np.swapaxes(case.grad_out, 1, 2), case.dtype)
            cts = pull(d_out if d_out.dtype == out.dtype else d_out.astype(out.dtype))
        except KernelError:
            raise
        except Exception as exc:
            if is_refusal(self, exc):   # the kernel says it has no backward here: unsupported
                raise NotSupported(f"{self.name}'s backward raised {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
            raise KernelError(f"kernel's backward (jax.vjp) raised {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        grads: dict[str, np.ndarray] = {}
        for name, primal, ct in zip(("dq", "dk", "dv", "dbias"), primals, cts):
            if not isinstance(ct, jax.Array) or ct.shape != primal.shape:
                raise KernelError(f"kernel's backward gave {name} {type(ct).__name__} {getattr(ct, 'shape', '')}; "
                                  f"expected shape {primal.shape}")
            g = to_numpy(ct)
            grads[name] = g.reshape(case.bias.shape) if name == "dbias" else from_btnh(g)
        return {n: np.asarray(g, dtype=np.float64) for n, g in grads.items()}

    def run_raw(self, q, k, v, dtype):
        conv = [self._to_array(np.swapaxes(np.asarray(x, dtype=np.float64), -3, -2), dtype) for x in (q, k, v)]
        return np.swapaxes(self._to_numpy(self.fn(*conv)), -3, -2)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "calling_convention": "jax.nn.dot_product_attention (BTNH)",
                "gradients": "jax.vjp of the kernel with respect to query, key, value (and bias)"}


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
                f"key_value_seq_lengths=[, local_window_size=]): {exc}")
    return None
