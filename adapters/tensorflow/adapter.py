"""The `tensorflow` backend: Keras 3 attention on the TensorFlow runtime.

Implementations:
- `tensorflow:keras-eager`: `keras.ops.dot_product_attention`, run eagerly.
- `tensorflow:keras-xla`: the same op inside `tf.function(jit_compile=True)`.
- `tensorflow:keras-mha`, `tensorflow:keras-mha-scores`: `keras.layers.MultiHeadAttention`
  (layer adapters, see `adapters/tensorflow/layer.py`); the second asks for the scores,
  which routes through the layer's own masked softmax instead of the fused op.
- `tensorflow:tf-keras-mha`: the legacy `tf_keras` layer, present only when `tf_keras`
  is importable (it is not installed by default: its wheel requires the `tensorflow`
  distribution, which would overwrite `tensorflow-cpu`).

Keras reads `KERAS_BACKEND` once, at its first import (which `import tensorflow` does), so
`tensorflow_common` sets it, if unset, before importing TensorFlow. If Keras was already
imported with another backend the Keras implementations say so instead of running on the wrong one.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from attnconf.reference import Case, visibility
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import COMPILES_PER_SHAPE, Adapter, KernelError, Result
from attnconf.adapters.callable import CallableAdapter
from attnconf.adapters.tensorflow.common import (configure, device_string, error_line, keras_module, to_numpy, to_tensor,
                                versions)

# ---- translating a Case into keras.ops.dot_product_attention arguments ------
def keras_arguments(case: Case) -> dict[str, Any]:
    """NumPy arguments for keras.ops.dot_product_attention in its BTNH layout.

    Top-left causal goes through `is_causal`, the bias through `bias` (as given,
    -inf included), a boolean mask through `mask`; what Keras has no argument
    for (bottom-right causal, padding lengths) is folded into `mask` with
    `reference.visibility`.
    """
    s = case.shape
    needs_fold = case.causal == "bottom_right" or case.q_lengths is not None or case.kv_lengths is not None
    mask = case.mask
    if needs_fold:
        full = (s["B"], s["Hq"], s["Lq"], s["Lk"])
        vis = visibility(full, mask=case.mask, causal=case.causal if case.causal == "bottom_right" else None,
                         q_lengths=case.q_lengths, kv_lengths=case.kv_lengths)
        mask = vis[:, :1] if (vis == vis[:, :1]).all() else vis
    btnh = (0, 2, 1, 3)
    return dict(query=np.transpose(case.q, btnh), key=np.transpose(case.k, btnh),
                value=np.transpose(case.v, btnh), mask=mask, bias=case.bias,
                is_causal=case.causal == "top_left", scale=case.scale)


def _attention(q, k, v, mask, bias, scale, is_causal: bool):
    """Spec-layout (B, H, L, D) tensors in, spec-layout output out."""
    keras = keras_module()
    out = keras.ops.dot_product_attention(
        tf.transpose(q, (0, 2, 1, 3)), tf.transpose(k, (0, 2, 1, 3)), tf.transpose(v, (0, 2, 1, 3)),
        bias=bias, mask=mask, scale=scale, is_causal=is_causal)
    return tf.transpose(out, (0, 2, 1, 3))


class KerasOpAdapter(Adapter):
    """keras.ops.dot_product_attention, eager."""

    backend = "tensorflow"
    name = "tensorflow:keras-eager"
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths",
                              "kv_lengths", "gqa", "custom_scale", "dv_ne_dk", "cross", "mask_with_causal",
                              "grads", "dbias"})
    # No "noncontiguous" / "broadcast_kv": TF tensors have no user-visible strides, so
    # those layouts cannot be expressed; such cases are reported unsupported.
    max_head_dim = None
    jit = False

    def __init__(self, device: str = "cpu", allow_tf32: bool = False):
        super().__init__(device)
        self.allow_tf32 = allow_tf32
        self._fn: Callable[..., Any] = _attention

    def tensors(self, case: Case) -> dict[str, Any]:
        args = keras_arguments(case)
        t = case.dtype
        tensors = {"q": to_tensor(case.q, t), "k": to_tensor(case.k, t), "v": to_tensor(case.v, t),
                   "mask": None if args["mask"] is None else to_tensor(args["mask"], "bool"),
                   "bias": None if case.bias is None else to_tensor(case.bias, t)}
        return tensors

    def call(self, tensors: dict[str, Any], case: Case):
        return self._fn(tensors["q"], tensors["k"], tensors["v"], tensors["mask"], tensors["bias"],
                        case.scale, case.causal == "top_left")

    def run(self, case: Case, *, grads: bool = False) -> Result:
        with tf.device(device_string(self.device)):
            tensors = self.tensors(case)
            try:
                if not grads:
                    out = self.call(tensors, case)
                    g = None
                else:
                    watched = [n for n in ("q", "k", "v", "bias") if tensors[n] is not None]
                    with tf.GradientTape() as tape:
                        for n in watched:
                            tape.watch(tensors[n])
                        out = self.call(tensors, case)
                    d_out = to_tensor(case.grad_out, case.dtype)
                    gs = tape.gradient(out, [tensors[n] for n in watched], output_gradients=d_out)
                    names = {"q": "dq", "k": "dk", "v": "dv", "bias": "dbias"}
                    g = {names[n]: (np.zeros(tensors[n].shape) if d is None else to_numpy(d))
                         for n, d in zip(watched, gs)}
            except KernelError:
                raise
            except Exception as exc:
                raise KernelError(f"{self.name} raised {type(exc).__name__}: {error_line(exc)}") from exc
        return Result(out=to_numpy(out), out_dtype=out.dtype.name, grads=g, kernel=self.kernel_name(),
                      notes={"tf32": self.allow_tf32})

    def kernel_name(self) -> str:
        return "keras.ops.dot_product_attention (tensorflow backend, eager)"

    def run_raw(self, q, k, v, dtype):
        with tf.device(device_string(self.device)):
            ts = [to_tensor(x, dtype) for x in (q, k, v)]
            return to_numpy(self._fn(*ts, None, None, None, False))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **versions(), "kernel": self.kernel_name(), "xla": self.jit,
                "tf_device": device_string(self.device), "allow_tf32": self.allow_tf32}


class KerasXlaAdapter(KerasOpAdapter):
    """keras.ops.dot_product_attention compiled by XLA (one compilation per input signature)."""

    name = "tensorflow:keras-xla"
    capabilities = KerasOpAdapter.capabilities - {"grads", "dbias"}
    jit = True
    example_budget = COMPILES_PER_SHAPE   # every new input signature compiles (0.2 s an example; eager 0.04 s)

    def __init__(self, device: str = "cpu", allow_tf32: bool = False):
        super().__init__(device, allow_tf32)
        # tf.function keys its traces on the tensor signature plus the Python values
        # (None-ness of mask/bias, is_causal). A Python float scale would key it too (one
        # compilation per scale value), so the scale goes in as a float32 scalar tensor:
        # Keras' tf.cast(scale, ...) turns a Python float into float32 first, so the value
        # that reaches the logits is bit-identical to the eager path's.
        self._fn = tf.function(_attention, jit_compile=True)

    def call(self, tensors: dict[str, Any], case: Case):
        scale = None if case.scale is None else tf.constant(case.scale, tf.float32)
        return self._fn(tensors["q"], tensors["k"], tensors["v"], tensors["mask"], tensors["bias"],
                        scale, case.causal == "top_left")

    def kernel_name(self) -> str:
        return "keras.ops.dot_product_attention (tensorflow backend) in tf.function(jit_compile=True)"


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    allow = configure(options)
    if device == "gpu" and not tf.config.list_physical_devices("GPU"):
        return []
    from attnconf.adapters.tensorflow.layer import layer_implementations  # noqa: PLC0415

    return [KerasOpAdapter(device, allow), KerasXlaAdapter(device, allow), *layer_implementations(device, allow)]


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    """Wrap a TF function with the SDPA convention ((B, H, L, D) tf tensors in and out)."""

    def place(x: np.ndarray, dtype: str) -> tf.Tensor:
        with tf.device(device_string(device)):
            return to_tensor(x, dtype)

    return CallableAdapter(fn, backend="tensorflow", name=name, device=device, to_array=place,
                           to_numpy=lambda t: t.numpy() if isinstance(t, (tf.Tensor, tf.Variable)) else to_numpy(t),
                           dtype_name=lambda t: t.dtype.name)
