"""Keras `MultiHeadAttention` layers as layer adapters (clause ATTN-MHA-1).

A `reference.layer.LayerCase` holds (E, E) projection matrices applied as
`y = x @ W + b`, head h using columns [h*d, (h+1)*d). Keras stores the same
maps as EinsumDense kernels: (E, heads, d) for query/key/value (a row-major
reshape of W, so column h*d + j becomes [h, j]) and (heads, d, E) for the output
(rows of W_O reshaped the same way). Keras has one `use_bias` switch for all
four projections, so a missing bias is loaded as zeros (the same map).

The layer runs on two paths in Keras 3: the fused `ops.dot_product_attention`
call, and, when attention scores are requested, its own masked softmax. They
differ on fully-masked rows, so both are offered as implementations.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Literal

import numpy as np
import tensorflow as tf

from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import KernelError, LayerAdapter
from attnconf.adapters.tensorflow.common import device_string, error_line, keras_module, to_tensor, versions



def keras_weights(lc: Any) -> list[np.ndarray]:
    """The LayerCase's projections in Keras' weight order (q, k, v, output; kernel then bias)."""
    E = lc.w_q.shape[0]
    h = lc.num_heads
    d = E // h
    weights = []
    for w, b in ((lc.w_q, lc.b_q), (lc.w_k, lc.b_k), (lc.w_v, lc.b_v)):
        weights.append(np.asarray(w, dtype=np.float64).reshape(E, h, d))
        weights.append(np.zeros((h, d)) if b is None else np.asarray(b, dtype=np.float64).reshape(h, d))
    weights.append(np.asarray(lc.w_o, dtype=np.float64).reshape(h, d, E))
    weights.append(np.zeros(E) if lc.b_o is None else np.asarray(lc.b_o, dtype=np.float64))
    return weights


class KerasMHAAdapter(LayerAdapter):
    """keras.layers.MultiHeadAttention on its default (fused dot_product_attention) path."""

    backend = "tensorflow"
    name = "tensorflow:keras-mha"
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = frozenset({"mask", "causal_top_left", "cross", "mask_with_causal"})
    return_scores = False

    def __init__(self, device: str = "cpu", allow_tf32: bool = False):
        super().__init__(device)
        self.allow_tf32 = allow_tf32
        self._layers: dict[tuple, Any] = {}

    # -- the layer, built once per (E, heads, dtype) ---------------------------
    def layers_module(self):
        return keras_module().layers

    def layer(self, E: int, heads: int, dtype: str):
        key = (E, heads, dtype)
        if key not in self._layers:
            layer = self.layers_module().MultiHeadAttention(num_heads=heads, key_dim=E // heads, dtype=dtype)
            x = tf.zeros((1, 1, E), dtype=dtype)
            layer(x, x, x)  # builds the weights
            self._layers[key] = layer
        return self._layers[key]

    def extra_layer_support(self, lc: Any) -> Literal[True] | str:
        if lc.w_q.shape[0] % lc.num_heads:
            return f"{self.name} needs E divisible by num_heads"
        return True

    def run_layer(self, lc: Any) -> np.ndarray:
        t = lc.dtype
        with tf.device(device_string(self.device)):
            E = lc.w_q.shape[0]
            layer = self.layer(E, lc.num_heads, t)
            layer.set_weights([np.asarray(to_tensor(w, t).numpy()) for w in keras_weights(lc)])
            kwargs: dict[str, Any] = {"use_causal_mask": lc.causal == "top_left"}
            if lc.mask is not None:
                kwargs["attention_mask"] = to_tensor(lc.mask, "bool")
            if self.return_scores:
                kwargs["return_attention_scores"] = True
            try:
                out = layer(to_tensor(lc.x_q, t), to_tensor(lc.x_v, t), to_tensor(lc.x_k, t), **kwargs)
            except Exception as exc:
                raise KernelError(f"{self.name} raised {type(exc).__name__}: {error_line(exc)}") from exc
            if self.return_scores:
                out = out[0]
        return tf.cast(out, tf.float64).numpy()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **versions(), "kernel": self.kernel_name(), "tf_device": device_string(self.device),
                "allow_tf32": self.allow_tf32}

    def kernel_name(self) -> str:
        return "keras.layers.MultiHeadAttention (fused ops.dot_product_attention path)"


class KerasMHAScoresAdapter(KerasMHAAdapter):
    """keras.layers.MultiHeadAttention with return_attention_scores=True (the layer's masked softmax)."""

    name = "tensorflow:keras-mha-scores"

    return_scores = True

    def kernel_name(self) -> str:
        return "keras.layers.MultiHeadAttention (return_attention_scores=True: einsum + masked Softmax path)"


class TfKerasMHAAdapter(KerasMHAAdapter):
    """The legacy Keras 2 layer from the `tf_keras` package."""

    name = "tensorflow:tf-keras-mha"

    def layers_module(self):
        import tf_keras  # noqa: PLC0415

        return tf_keras.layers

    def describe(self) -> dict[str, Any]:
        import tf_keras  # noqa: PLC0415

        return {**super().describe(), "tf_keras": tf_keras.__version__}

    def kernel_name(self) -> str:
        return "tf_keras.layers.MultiHeadAttention (legacy Keras 2)"


def layer_implementations(device: str, allow_tf32: bool) -> list[LayerAdapter]:
    impls: list[LayerAdapter] = [KerasMHAAdapter(device, allow_tf32), KerasMHAScoresAdapter(device, allow_tf32)]
    if importlib.util.find_spec("tf_keras") is not None:
        impls.append(TfKerasMHAAdapter(device, allow_tf32))
    return impls
