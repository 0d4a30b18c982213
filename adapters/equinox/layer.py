"""`equinox:mha`: `equinox.nn.MultiheadAttention` loaded with a LayerCase's weights.

Equinox's `Linear` computes `weight @ x + bias` with weight (out_features, in_features)
(equinox/nn/_linear.py), so each projection's weight is the LayerCase's matrix transposed. The
query/key/value projections have num_heads * head_dim outputs reshaped to (seq, num_heads, head_dim)
(`MultiheadAttention._project`): head h takes columns [h*d:(h+1)*d], the reference's split. Each
projection has its own bias flag (`use_query_bias`, ...), so a LayerCase's missing bias is a missing
bias here too. The layer is unbatched: it is vmapped over the batch, with the LayerCase's (Lq, Lk)
mask per batch element (True = attend) and top-left causal folded into it; `inference=True`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import jax
import jax.numpy as jnp

import equinox as eqx

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

    d = {"framework": "equinox", "version": eqx.__version__ if hasattr(eqx, "__version__") else _dist_version(),
         "jax": jax.__version__, "jaxlib": jaxlib.__version__, "jax_enable_x64": bool(jax.config.jax_enable_x64),
         "matmul_precision": "default (allow_tf32)" if options.get("allow_tf32") else "highest (float16: default)"}
    try:
        d["jax_device"] = str(jax_device(device))
    except KernelError as exc:
        d["jax_device"] = str(exc)
    return d


def _dist_version() -> str:
    from importlib.metadata import version

    return version("equinox")


@eqx.filter_jit
def _apply(mha, xq, xk, xv, mask):
    if mask is None:
        return jax.vmap(lambda q, k, v: mha(q, k, v, inference=True))(xq, xk, xv)
    return jax.vmap(lambda q, k, v, m: mha(q, k, v, mask=m, inference=True))(xq, xk, xv, mask)


class EqxMhaAdapter(LayerAdapter):
    """equinox.nn.MultiheadAttention as a layer adapter (ATTN-MHA-1)."""

    backend = "equinox"
    name = "equinox:mha"
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    capabilities = frozenset({"mask", "causal_top_left", "mask_with_causal", "cross"})

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        enable_x64()      # float64 needs it; set when an adapter is made, never at import
        super().__init__("gpu" if device == "cuda" else device)
        self.options = dict(options or {})



    def module(self, lc) -> eqx.nn.MultiheadAttention:
        t = jnp.dtype(numpy_dtype(lc.dtype))
        E, H = lc.w_q.shape[0], lc.num_heads
        dev = jax_device(self.device)
        m = eqx.nn.MultiheadAttention(num_heads=H, query_size=E, use_query_bias=lc.b_q is not None,
                                      use_key_bias=lc.b_k is not None, use_value_bias=lc.b_v is not None,
                                      use_output_bias=lc.b_o is not None, dtype=t, key=jax.random.key(0))

        def put(x):
            return jax.device_put(np.asarray(x, dtype=np.float64).astype(t), dev)

        where, values = [], []
        for proj, w, b in (("query_proj", lc.w_q, lc.b_q), ("key_proj", lc.w_k, lc.b_k),
                           ("value_proj", lc.w_v, lc.b_v), ("output_proj", lc.w_o, lc.b_o)):
            where.append(lambda m, p=proj: getattr(m, p).weight)
            values.append(put(w.T))
            if b is not None:
                where.append(lambda m, p=proj: getattr(m, p).bias)
                values.append(put(b))
        return eqx.tree_at(lambda m: [f(m) for f in where], m, values)

    def run_layer(self, lc) -> np.ndarray:
        mha = self.module(lc)
        t = numpy_dtype(lc.dtype)
        dev = jax_device(self.device)
        xq, xk, xv = (jax.device_put(np.asarray(x).astype(t), dev) for x in (lc.x_q, lc.x_k, lc.x_v))
        B, Lq, Lk = lc.x_q.shape[0], lc.x_q.shape[1], lc.x_k.shape[1]
        mask = None
        if lc.mask is not None or lc.causal == "top_left":
            vis = np.ones((B, Lq, Lk), dtype=bool)
            if lc.mask is not None:
                vis &= lc.mask
            if lc.causal == "top_left":
                vis &= np.tril(np.ones((Lq, Lk), dtype=bool))
            mask = jax.device_put(vis, dev)
        try:
            with precision_context(self.options, lc.dtype):
                out = _apply(mha, xq, xk, xv, mask)
        except Exception as exc:
            raise KernelError(f"{self.name} raised {first_line(exc)}") from exc
        if str(out.dtype) != lc.dtype:
            raise KernelError(f"{self.name} returned {out.dtype} for {lc.dtype} inputs")
        return to_numpy(out).astype(np.float64)


    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **framework_versions(self.device, self.options),
                "api": "equinox.nn.MultiheadAttention, vmapped over the batch, inference=True",
                "kernel": "MultiheadAttention -> equinox.nn._attention.dot_product_attention per head, "
                          "under equinox.filter_jit"}
