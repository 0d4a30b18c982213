"""Wrap any SDPA-convention callable as an adapter, the way httpx's
`MockTransport(handler)` wraps a function: the whole suite then runs against it.

Conversion to and from the framework's arrays is passed in, so the same wrapper
serves NumPy, torch and JAX kernels. Third-party kernels are untrusted: the
wrapper checks what comes back and that the inputs were not mutated, and turns
every misbehaviour into a `KernelError` with a one-line reason.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from attnconf.reference import Case

from .base import Adapter, ConventionViolation, KernelError, NotSupported, Result
from .contract import is_refusal
from .sdpa_convention import fold_mask

FULL_SDPA = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                       "gqa", "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "dropout"})


class CallableAdapter(Adapter):
    """An adapter around `fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`."""

    trusted = False

    def __init__(self, fn: Callable[..., Any], *, backend: str, name: str, device: str = "cpu",
                 to_array: Callable[[np.ndarray, str], Any], to_numpy: Callable[[Any], np.ndarray],
                 dtype_name: Callable[[Any], str], capabilities: frozenset[str] = FULL_SDPA,
                 dtypes: tuple[str, ...] | None = None):
        super().__init__(device)
        self.fn, self.backend, self.name = fn, backend, name
        self._to_array, self._to_numpy, self._dtype_name = to_array, to_numpy, dtype_name
        self.capabilities = capabilities
        if dtypes is not None:
            self.dtypes = dtypes

    def inputs(self, case: Case, *, grads: bool = False) -> tuple:
        """query, key, value as the kernel's arrays (a framework's adapter may lay them out otherwise)."""
        return tuple(self._to_array(x, case.dtype) for x in (case.q, case.k, case.v))

    def arguments(self, case: Case, *, grads: bool = False) -> tuple[tuple, dict]:
        attn_mask, is_causal = fold_mask(case)
        if attn_mask is not None:
            attn_mask = self._to_array(attn_mask, "bool" if attn_mask.dtype == bool else case.dtype)
        s = case.shape
        args = self.inputs(case, grads=grads)
        kwargs = dict(attn_mask=attn_mask, dropout_p=case.dropout_p, is_causal=is_causal,
                      scale=case.scale, enable_gqa=s["Hkv"] != s["Hq"])
        return args, kwargs

    def call(self, args: tuple, kwargs: dict) -> Any:
        watched = {**dict(zip(("query", "key", "value"), args)),
                   **({"attn_mask": kwargs["attn_mask"]} if kwargs.get("attn_mask") is not None else {})}
        snapshots = {n: self._to_numpy(a).copy() for n, a in watched.items()}
        try:
            ret = self.fn(*args, **kwargs)
        except Exception as exc:  # the kernel's own failure, reported per test
            if is_refusal(self, exc):  # the kernel says it does not do this case: unsupported, never passed
                raise NotSupported(f"{self.name} raised {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
            raise KernelError(f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        for name, before in snapshots.items():
            if not np.array_equal(before, self._to_numpy(watched[name]), equal_nan=True):
                raise ConventionViolation("ATTN-OP-8", f"kernel mutated its input `{name}` in place")
        return ret

    def convert(self, ret: Any) -> tuple[np.ndarray, str]:
        try:
            out = self._to_numpy(ret)
            dtype = self._dtype_name(ret)
        except Exception:
            raise KernelError(f"kernel returned {type(ret).__name__}, not an array") from None
        if out.dtype.kind not in "fc" and out.dtype.name != "bfloat16":
            raise KernelError(f"kernel returned a {out.dtype} array, not floating point")
        return np.asarray(out, dtype=np.float64), dtype

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, kwargs = self.arguments(case)
        out, dtype = self.convert(self.call(args, kwargs))
        return Result(out=out, out_dtype=dtype, kernel=self.name)

    def run_raw(self, q, k, v, dtype):
        return self._to_numpy(self.fn(*(self._to_array(x, dtype) for x in (q, k, v))))

    def describe(self) -> dict[str, Any]:
        fn = self.fn
        return {**super().describe(), "kernel": f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}",
                "calling_convention": "sdpa", "scope": self.scope()}


def check_sdpa_signature(fn: Callable[..., Any]) -> str | None:
    """None if `fn` accepts the SDPA calling convention, else a one-line reason."""
    if not callable(fn):
        return f"{fn!r} is not callable"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins without signatures: accept and let calls tell
    try:
        sig.bind(0, 0, 0, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    except TypeError as exc:
        return f"signature {sig} does not take the SDPA convention (query, key, value, attn_mask=, dropout_p=, is_causal=, scale=, enable_gqa=): {exc}"
    return None
