"""`flax:linen-mha`: `flax.linen.MultiHeadDotProductAttention` loaded with a LayerCase's weights.

Linen keeps each projection as a `DenseGeneral` with kernel (E, heads, head_dim) and bias
(heads, head_dim) for query/key/value and kernel (heads, head_dim, E), bias (E,) for `out`
(flax/linen/attention.py, `MultiHeadDotProductAttention.__call__`). A LayerCase's (E, E) matrix
whose columns [h*d:(h+1)*d] belong to head h is therefore a plain C-order reshape. The layer's
`attention_fn` is `flax.linen.dot_product_attention`: scale fixed at 1/sqrt(head_dim), masked
logits replaced by finfo(dtype).min. The mask is built with flax's helpers: `make_causal_mask`
for top-left causal self-attention, `combine_masks` with the LayerCase's (B, 1, Lq, Lk) mask.
The parameters are passed to `Module.apply` directly (no `init`), under `jax.jit`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import jax
import jax.numpy as jnp

import flax.linen as nn

from attnconf.reference import numpy_dtype
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import KernelError, LayerAdapter
from attnconf.adapters.jax.common import enable_x64
from attnconf.adapters.jax.adapter import jax_device, precision_context, to_numpy


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


def framework_versions(device: str, options: dict[str, Any]) -> dict[str, Any]:
    import jaxlib

    d = {"framework": "flax", "version": flax.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
         "jax_enable_x64": bool(jax.config.jax_enable_x64),
         "matmul_precision": "default (allow_tf32)" if options.get("allow_tf32") else
         "highest (float16: default)"}
    try:
        d["jax_device"] = str(jax_device(device))
    except KernelError as exc:
        d["jax_device"] = str(exc)
    return d


def _apply(module, params, xq, xk, xv, mask, causal):
    lq, lk = xq.shape[1], xk.shape[1]
    masks = [mask]
    if causal:
        if lq == lk:
            masks.append(nn.make_causal_mask(jnp.zeros((1, lq)), dtype=jnp.bool_))
        else:
            masks.append(nn.make_attention_mask(jnp.arange(lq)[None], jnp.arange(lk)[None], jnp.greater_equal,
                                                dtype=jnp.bool_))
    full = nn.combine_masks(*masks, dtype=jnp.bool_)
    return module.apply({"params": params}, xq, xk, xv, mask=full, deterministic=True)


_apply_jit = jax.jit(_apply, static_argnames=("module", "causal"))


class LinenMhaAdapter(LayerAdapter):
    """flax.linen.MultiHeadDotProductAttention as a layer adapter (ATTN-MHA-1)."""

    backend = "flax"
    name = "flax:linen-mha"
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = frozenset({"mask", "causal_top_left", "mask_with_causal", "cross"})

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        enable_x64()      # float64 needs it; set when an adapter is made, never at import
        super().__init__("gpu" if device == "cuda" else device)
        self.options = dict(options or {})



    def module_and_params(self, lc) -> tuple[nn.Module, dict]:
        t = jnp.dtype(numpy_dtype(lc.dtype))
        E, H = lc.w_q.shape[0], lc.num_heads
        d = E // H
        use_bias = any(b is not None for b in (lc.b_q, lc.b_k, lc.b_v, lc.b_o))
        module = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, out_features=E, dtype=t,
                                                 param_dtype=t, use_bias=use_bias, dropout_rate=0.0)
        dev = jax_device(self.device)

        def put(x, shape):
            return jax.device_put(np.asarray(x, dtype=np.float64).reshape(shape).astype(t), dev)

        params: dict[str, dict] = {}
        for name, w, b in (("query", lc.w_q, lc.b_q), ("key", lc.w_k, lc.b_k), ("value", lc.w_v, lc.b_v)):
            params[name] = {"kernel": put(w, (E, H, d))}
            if use_bias:
                params[name]["bias"] = put(np.zeros(E) if b is None else b, (H, d))
        params["out"] = {"kernel": put(lc.w_o, (H, d, E))}
        if use_bias:
            params["out"]["bias"] = put(np.zeros(E) if lc.b_o is None else lc.b_o, (E,))
        return module, params

    def run_layer(self, lc) -> np.ndarray:
        module, params = self.module_and_params(lc)
        t = numpy_dtype(lc.dtype)
        dev = jax_device(self.device)
        xq, xk, xv = (jax.device_put(np.asarray(x).astype(t), dev) for x in (lc.x_q, lc.x_k, lc.x_v))
        mask = None if lc.mask is None else jax.device_put(np.asarray(lc.mask, dtype=bool)[:, None], dev)
        try:
            with precision_context(self.options, lc.dtype):
                out = _apply_jit(module, params, xq, xk, xv, mask, lc.causal == "top_left")
        except Exception as exc:
            raise KernelError(f"{self.name} raised {first_line(exc)}") from exc
        if str(out.dtype) != lc.dtype:
            raise KernelError(f"{self.name} returned {out.dtype} for {lc.dtype} inputs")
        return to_numpy(out).astype(np.float64)


    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **framework_versions(self.device, self.options),
                "api": "flax.linen.MultiHeadDotProductAttention (linen), deterministic=True, params via apply",
                "kernel": "MultiHeadDotProductAttention -> flax.linen.dot_product_attention under jax.jit"}
