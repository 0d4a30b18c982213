"""`jax:flax-mha`: flax nnx `MultiHeadAttention` loaded with a LayerCase's weights.

flax keeps the projections as `LinearGeneral` kernels of shape (E, heads,
head_dim) for query/key/value and (heads, head_dim, E) for the output, with
biases (heads, head_dim) and (E,). A LayerCase's (E, E) matrix whose columns
[h*d:(h+1)*d] belong to head h is therefore a plain C-order reshape; the output
matrix's rows [h*d:(h+1)*d] likewise. With dropout 0 flax hands the per-head
attention to `jax.nn.dot_product_attention` (xla), so causal masking is
top-left `is_causal` and the scale is fixed at 1/sqrt(head_dim).

The layer runs under `nnx.jit`, as models run it, except in float16 and bfloat16, where JAX's
attention can raise under jit on CPU (OP_BY_OP), so those run op by op. The module is built with zero
initialisers: its weights are overwritten at once, and random initialisation only cost compile time.
"""
from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np

import jax
import jax.numpy as jnp

from attnconf.spec.vocabulary import DTYPES, HALF_DTYPES

from attnconf.adapters.base import COMPILES_PER_SHAPE, KernelError, LayerAdapter
from attnconf.adapters.jax.common import enable_x64, jax_device, precision_context, to_numpy


# Under jit JAX's attention raises on CPU in these dtypes: float16 always (JAX-XLA-CPU-F16-JIT-RAISES),
# bfloat16 on 1x1 shapes ("Algorithm not supported by the ElementalIrEmitter: ALG_DOT_BF16_BF16_F32",
# measured with jax 0.10.2; the eager call falls back to the default precision).
OP_BY_OP = HALF_DTYPES


def _call(m, xq, xk, xv, mask, *, is_causal: bool):
    return m(xq, xk, xv, mask=mask, is_causal=is_causal, deterministic=True)


@functools.cache
def _call_jit():
    from flax import nnx

    return nnx.jit(_call, static_argnames=("is_causal",))


class FlaxMhaAdapter(LayerAdapter):
    """flax.nnx.MultiHeadAttention as a layer adapter (ATTN-MHA-1)."""

    backend = "jax"
    name = "jax:flax-mha"
    example_budget = COMPILES_PER_SHAPE   # every new shape compiles, under nnx.jit or op by op (0.1-0.8 s an example)
    devices = ("cpu", "gpu")
    dtypes = DTYPES
    # inputs_q and inputs_k may differ in length; a mask combines with is_causal
    capabilities = frozenset({"mask", "causal_top_left", "cross", "mask_with_causal"})

    def __init__(self, device: str = "cpu", options: dict[str, Any] | None = None):
        super().__init__(device)
        self.options = dict(options or {})
        enable_x64()

    def extra_layer_support(self, lc) -> Literal[True] | str:
        E = lc.w_q.shape[0]
        if E % lc.num_heads:
            return f"embed dim {E} is not a multiple of num_heads {lc.num_heads}"
        return True

    def build(self, lc):
        """An nnx.MultiHeadAttention holding the LayerCase's weights, in its dtype."""
        from flax import nnx

        from attnconf.reference import numpy_dtype

        t = jnp.dtype(numpy_dtype(lc.dtype))
        E, H = lc.w_q.shape[0], lc.num_heads
        d = E // H
        biases = (lc.b_q, lc.b_k, lc.b_v, lc.b_o)
        use_bias = any(b is not None for b in biases)
        m = nnx.MultiHeadAttention(num_heads=H, in_features=E, qkv_features=E, out_features=E,
                                   dtype=t, param_dtype=t, use_bias=use_bias, decode=False,
                                   kernel_init=nnx.initializers.zeros_init(), bias_init=nnx.initializers.zeros_init(),
                                   rngs=nnx.Rngs(0))
        dev = jax_device(self.device)

        def put(x, shape):
            return jax.device_put(np.asarray(x, dtype=np.float64).reshape(shape).astype(t), dev)

        for proj, w, b in ((m.query, lc.w_q, lc.b_q), (m.key, lc.w_k, lc.b_k), (m.value, lc.w_v, lc.b_v)):
            proj.kernel[...] = put(w, (E, H, d))
            if use_bias:
                proj.bias[...] = put(np.zeros(E) if b is None else b, (H, d))
        m.out.kernel[...] = put(lc.w_o, (H, d, E))
        if use_bias:
            m.out.bias[...] = put(np.zeros(E) if lc.b_o is None else lc.b_o, (E,))
        return m, t, dev

    def run_layer(self, lc) -> np.ndarray:
        m, t, dev = self.build(lc)
        xq, xk, xv = (jax.device_put(np.asarray(x).astype(t), dev) for x in (lc.x_q, lc.x_k, lc.x_v))
        mask = None if lc.mask is None else jax.device_put(np.asarray(lc.mask, dtype=bool)[:, None], dev)
        try:
            with precision_context(self.options, lc.dtype):
                call = _call if lc.dtype in OP_BY_OP else _call_jit()
                out = call(m, xq, xk, xv, mask, is_causal=lc.causal == "top_left")
        except Exception as exc:
            raise KernelError(f"{self.name} raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
        return to_numpy(out).astype(np.float64)

    def describe(self) -> dict[str, Any]:
        import flax

        return {**super().describe(), "framework": "jax", "version": jax.__version__, "flax": flax.__version__,
                "api": "flax.nnx.MultiHeadAttention (nnx, not linen)",
                "kernel": "flax nnx MultiHeadAttention -> jax.nn.dot_product_attention (xla)",
                "run": f"under nnx.jit; {' and '.join(OP_BY_OP)} op by op (under jit jax's attention can raise on CPU)"}
