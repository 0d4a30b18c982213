"""What the JAX adapters share: devices, conversions, matmul precision, the x64 switch.

The SDPA adapters (jax.py), the flax layer (jax_layer.py) and the kernel wrapper (jax_kernel.py)
import from here, so none of them imports another (no import cycle). Nothing here changes a
setting at import: `enable_x64()` is called by each adapter's constructor.
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

import jax

from attnconf.reference import numpy_dtype

from attnconf.adapters.base import KernelError


def enable_x64() -> None:
    """Turn on jax_enable_x64 (process-wide; called when a JAX adapter is created, never at import).

    Without it JAX silently computes float64 inputs in float32.
    """
    if not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def jax_device(device: str):
    """The first JAX device of the kind the suite calls `device` ('cpu' or 'gpu')."""
    try:
        return jax.devices("gpu" if device in ("gpu", "cuda") else "cpu")[0]
    except RuntimeError as exc:
        raise KernelError(f"JAX has no {device} device here: {str(exc).splitlines()[0]}") from None


def to_jax(x: np.ndarray | None, dtype: str, device) -> jax.Array | None:
    """float64 NumPy -> JAX array of `dtype` ('bool' and 'int32' allowed) on `device`."""
    if x is None:
        return None
    t = {"bool": np.dtype(bool), "int32": np.dtype(np.int32)}.get(dtype) or numpy_dtype(dtype)
    return jax.device_put(np.asarray(x).astype(t), device)


def to_numpy(a: Any) -> np.ndarray:
    if not isinstance(a, jax.Array):
        raise TypeError(f"not a jax.Array: {type(a).__name__}")
    return np.asarray(jax.device_get(a))


def precision_context(options: dict[str, Any], dtype: str = "float32"):
    """'highest' matmul precision unless TF32 is allowed, except for float16.

    float16 is left at the default: XLA's GPU backend rejects the 'highest' algorithm for float16
    dots (measured on an H100, jax 0.11.2: "Unsupported dot precision algorithm"). bfloat16 keeps
    'highest': at the default its backward asks for ALG_DOT_BF16_BF16_F32, which the CPU backend
    rejects (measured: --hypothesis-seed=9, jax 0.10.2).
    """
    if options.get("allow_tf32") or dtype == "float16":
        return contextlib.nullcontext()
    return jax.default_matmul_precision("highest")
