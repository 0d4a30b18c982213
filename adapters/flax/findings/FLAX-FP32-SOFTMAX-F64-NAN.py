"""FLAX-FP32-SOFTMAX-F64-NAN: flax.linen.dot_product_attention(force_fp32_for_softmax=True) turns a
fully-masked float64 row into NaN. Needs only jax, flax and NumPy.
Exit 0 + "REPRODUCED: ..." when the bug shows, 1 + "NOT REPRODUCED: ..." when it does not,
2 + "CANNOT RUN: ..." when a library is missing."""
import sys

try:
    import numpy as np
    import jax

    jax.config.update("jax_enable_x64", True)   # float64 needs x64 in JAX
    import jax.numpy as jnp
    import flax
    import flax.linen as nn
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

rng = np.random.default_rng(0)
# BTNH: batch 1, 4 queries / 4 keys, 1 head, depth 8, float64
q, k, v = (jnp.asarray(rng.standard_normal((1, 4, 1, 8)), jnp.float64) for _ in range(3))
mask = np.ones((1, 1, 4, 4), dtype=bool)
mask[0, 0, 1, :] = False                      # query 1 may attend to no key
mask = jnp.asarray(mask)

flagged = np.asarray(nn.dot_product_attention(q, k, v, mask=mask, force_fp32_for_softmax=True))
default = np.asarray(nn.dot_product_attention(q, k, v, mask=mask))
print(f"jax {jax.__version__}, flax {flax.__version__}, x64 {jax.config.jax_enable_x64}")
print(f"output dtype {flagged.dtype}")
print(f"row 1 with force_fp32_for_softmax=True : {flagged[0, 1, 0]}")
print(f"row 1 with the default                  : {default[0, 1, 0]}")
print(f"rows 0, 2, 3 finite with the flag: {bool(np.isfinite(flagged[0, [0, 2, 3]]).all())}")
if np.isnan(flagged[0, 1, 0]).any():
    print("REPRODUCED: force_fp32_for_softmax=True gives NaN for a fully-masked float64 row "
          "(finfo(float64).min becomes -inf in float32)")
    sys.exit(0)
print("NOT REPRODUCED: the fully-masked float64 row is finite with force_fp32_for_softmax=True")
sys.exit(1)
