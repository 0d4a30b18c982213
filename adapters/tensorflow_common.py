"""What the TensorFlow adapters share: conversions, devices, error lines, Keras on TensorFlow.

tensorflow.py (the ops) and tensorflow_layer.py (the MultiHeadAttention layers) both import from
here, so neither imports the other (no import cycle). Importing this module changes no setting:
`keras_module()` sets KERAS_BACKEND (if unset) just before Keras' first import, and `configure()`
applies the TF32 flag; adapters call both when they are created or loaded.

TensorFlow's C++ log level (TF_CPP_MIN_LOG_LEVEL) is read when TensorFlow loads, so it is the
launcher's to set (the Makefile, `reports.runall` and `attnconf certify` set 2, which hides the
oneDNN / CPU-feature banners).
"""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import tensorflow as tf

from .base import KernelError

KERAS_BACKEND_PRESET: dict[str, str | None] = {}   # KERAS_BACKEND as found before attnconf set it


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


def select_keras_backend() -> None:
    """Set KERAS_BACKEND=tensorflow (if unset) before Keras' first import; remember what was there."""
    if "value" not in KERAS_BACKEND_PRESET:
        KERAS_BACKEND_PRESET["value"] = os.environ.get("KERAS_BACKEND")
        if "keras" not in sys.modules:
            os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def keras_module():
    """Keras, checked to be running on TensorFlow."""
    select_keras_backend()
    import keras  # noqa: PLC0415 (after KERAS_BACKEND is set)

    if keras.backend.backend() != "tensorflow":
        raise KernelError(f"keras was imported with backend {keras.backend.backend()!r} before attnconf "
                          "could set KERAS_BACKEND=tensorflow; run the tensorflow backend in its own process")
    return keras


def versions() -> dict[str, Any]:
    keras = keras_module()

    return {"framework": "tensorflow", "version": tf.__version__, "keras": keras.__version__,
            "keras_backend": keras.backend.backend(),
            "KERAS_BACKEND": os.environ.get("KERAS_BACKEND"),
            "KERAS_BACKEND_preset": KERAS_BACKEND_PRESET.get("value"),
            "tf32_enabled": bool(tf.config.experimental.tensor_float_32_execution_enabled())}
