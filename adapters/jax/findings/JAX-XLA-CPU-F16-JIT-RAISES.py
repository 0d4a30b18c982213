"""JAX-XLA-CPU-F16-JIT-RAISES: jax.nn.dot_product_attention in float16 raises under jit on CPU for
every shape ("The precision 'F16_F16_F32' is not supported by dot_general on CPU"), although the
function carries a fallback for platforms without that precision; eager mode works.

Needs only jax and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
try:
    import jax
    import jax.numpy as jnp
    import numpy as np
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v)


def reference(q, k, v):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def main() -> int:
    print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, devices {jax.devices()}")
    if jax.devices()[0].platform != "cpu":
        print("CANNOT RUN: no CPU device (the finding is about the CPU lowering)")
        return 2
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, 16, 4, 32)), jnp.float16)
    k, v = (jnp.asarray(rng.normal(size=(2, 24, 4, 32)), jnp.float16) for _ in range(2))
    eager = np.asarray(attention(q, k, v))
    print(f"eager: ok, max |out - float64 reference| = {np.abs(eager - reference(q, k, v)).max():.2g}")
    try:
        out = jax.block_until_ready(jax.jit(attention)(q, k, v))
    except Exception as exc:  # raised while lowering the jitted function
        message = str(exc).splitlines()[0]
        print(f"jit:   {type(exc).__name__}: {message}")
        print(f"REPRODUCED: float16 dot_product_attention raises under jit on CPU ({message}); "
              "the same call runs eagerly")
        return 0
    print(f"jit:   ok, max |out - float64 reference| = {np.abs(np.asarray(out) - reference(q, k, v)).max():.2g}")
    print("NOT REPRODUCED: float16 dot_product_attention runs under jit on CPU")
    return 1


if __name__ == "__main__":
    sys.exit(main())
