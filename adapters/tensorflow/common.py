"""What the TensorFlow adapters share: conversions, devices, error lines, Keras on TensorFlow.

tensorflow.py (the ops) and tensorflow_layer.py (the MultiHeadAttention layers) both import from
here, so neither imports the other (no import cycle).

The one place where importing an attnconf module changes process state: `import tensorflow`
imports Keras, and Keras reads KERAS_BACKEND once, at its first import, so KERAS_BACKEND (and
TF_CPP_MIN_LOG_LEVEL, read when TensorFlow's C++ runtime loads) must be set before that import,
here, both only if unset (a user's choice wins; `keras_module()` checks the backend Keras really got).
tests/test_import_hygiene.py declares exactly these two as this module's import effects. The TF32
flag is applied by `configure()` when the adapters are loaded.
"""
from __future__ import annotations

import os

KERAS_BACKEND_PRESET = os.environ.get("KERAS_BACKEND")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# 2 hides TF's C++ INFO and WARNING lines (CPU-feature banners); errors still print.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from attnconf.adapters.base import KernelError  # noqa: E402


_TF_DTYPES = {"float64": tf.float64, "float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}


# ---- conversions ----------------------------------------------------------
def to_tensor(x: np.ndarray, dtype: str) -> tf.Tensor:
    """A tf tensor of `dtype` holding x (exact: case inputs are already rounded to dtype)."""
    if dtype == "bool":
        return tf.constant(np.asarray(x, dtype=bool))
    return tf.cast(tf.constant(np.asarray(x, dtype=np.float64)), _TF_DTYPES[dtype])


def to_numpy(t: Any) -> np.ndarray:
    """float64 NumPy copy of a tf tensor (raises TypeError for anything else)."""
    if not isinstance(t, (tf.Tensor, tf.Variable)):
        raise TypeError(f"not a tf tensor: {type(t).__name__}")
    if t.dtype == tf.bool:
        return t.numpy()
    return tf.cast(t, tf.float64).numpy()


def error_line(exc: BaseException) -> str:
    """The informative line of a TF error (tf.function wraps it after 'in user code:' and a traceback)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("in user code") else lines[0]


def device_string(device: str) -> str:
    return "/GPU:0" if device == "gpu" else "/CPU:0"


def configure(options: dict[str, Any]) -> bool:
    """Apply the process-wide TF flags the options ask for; returns whether TF32 is allowed."""
    allow = bool(options.get("allow_tf32", False))
    tf.config.experimental.enable_tensor_float_32_execution(allow)
    return allow


def keras_module():
    """Keras, checked to be running on TensorFlow."""
    import keras  # noqa: PLC0415 (after KERAS_BACKEND is set)

    if keras.backend.backend() != "tensorflow":
        raise KernelError(f"keras was imported with backend {keras.backend.backend()!r} before attnconf "
                          "could set KERAS_BACKEND=tensorflow; run the tensorflow backend in its own process")
    return keras


def versions() -> dict[str, Any]:
    import keras  # noqa: PLC0415

    return {"framework": "tensorflow", "version": tf.__version__, "keras": keras.__version__,
            "keras_backend": keras.backend.backend(),
            "KERAS_BACKEND": os.environ.get("KERAS_BACKEND"),
            "KERAS_BACKEND_preset": KERAS_BACKEND_PRESET,
            "tf32_enabled": bool(tf.config.experimental.tensor_float_32_execution_enabled())}
