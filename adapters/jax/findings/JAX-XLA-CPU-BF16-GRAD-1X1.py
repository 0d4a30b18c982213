"""JAX-XLA-CPU-BF16-GRAD-1X1: jax.nn.dot_product_attention in bfloat16 under jit on CPU raises
"Algorithm not supported by the ElementalIrEmitter: ALG_DOT_BF16_BF16_F32" when batch, heads,
query length and key length are all 1 (forward and vjp); eager mode and every larger shape work.

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


def vjp(q, k, v, g):
    out, pullback = jax.vjp(attention, q, k, v)
    return out, pullback(g)


def try_call(label, fn, *args):
    try:
        jax.block_until_ready(fn(*args))
        print(f"{label}: ok")
        return None
    except Exception as exc:  # the failure is an XLA runtime error raised at compile time
        message = str(exc).splitlines()[0]
        print(f"{label}: {type(exc).__name__}: {message}")
        return message


def main() -> int:
    print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, devices {jax.devices()}")
    if jax.devices()[0].platform != "cpu":
        print("CANNOT RUN: no CPU device (the finding is about XLA:CPU)")
        return 2
    rng = np.random.default_rng(9)
    shape = (1, 1, 1, 8)  # (batch, length, heads, head_dim): B = T = S = N = 1
    q, k, v, g = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for _ in range(4))
    eager_fwd = try_call("eager forward", attention, q, k, v)
    eager_vjp = try_call("eager vjp", vjp, q, k, v, g)
    jit_fwd = try_call("jit forward", jax.jit(attention), q, k, v)
    jit_vjp = try_call("jit vjp", jax.jit(vjp), q, k, v, g)
    for label, s_q, s_kv in (("jit vjp, B=2", (2, 1, 1, 8), (2, 1, 1, 8)),
                             ("jit vjp, T=1 S=2", (1, 1, 1, 8), (1, 2, 1, 8))):
        qq = jnp.asarray(rng.normal(size=s_q), jnp.bfloat16)
        kk, vv = (jnp.asarray(rng.normal(size=s_kv), jnp.bfloat16) for _ in range(2))
        try_call(label, jax.jit(vjp), qq, kk, vv, jnp.ones(s_q, jnp.bfloat16))
    failures = [m for m in (jit_fwd, jit_vjp) if m]
    if failures and not (eager_fwd or eager_vjp):
        print(f"REPRODUCED: bfloat16 attention with B=T=S=N=1 raises under jit on CPU "
              f"({failures[0]}) while eager mode works")
        return 0
    print("NOT REPRODUCED: bfloat16 attention with B=T=S=N=1 runs under jit on CPU")
    return 1


if __name__ == "__main__":
    sys.exit(main())
