"""FLAX-FP32-SOFTMAX-OUTPUT-DTYPE: flax.linen.dot_product_attention(force_fp32_for_softmax=True) returns
float32 for bfloat16/float16 inputs. Needs only jax, flax and NumPy.
Exit 0 + "REPRODUCED: ..." when the behaviour shows, 1 + "NOT REPRODUCED: ..." when it does not,
2 + "CANNOT RUN: ..." when a library is missing."""
import sys

try:
    import numpy as np
    import jax
    import jax.numpy as jnp
    import flax
    import flax.linen as nn
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

rng = np.random.default_rng(0)
print(f"jax {jax.__version__}, flax {flax.__version__}")
promoted = []
for dtype in (jnp.bfloat16, jnp.float16):
    q, k, v = (jnp.asarray(rng.standard_normal((2, 5, 3, 8)), dtype) for _ in range(3))   # BTNH
    flagged = nn.dot_product_attention(q, k, v, force_fp32_for_softmax=True)
    default = nn.dot_product_attention(q, k, v)
    weights = nn.dot_product_attention_weights(q, k, force_fp32_for_softmax=True)
    print(f"{jnp.dtype(dtype).name} inputs: output {flagged.dtype} with the flag, {default.dtype} without; "
          f"weights {weights.dtype}")
    if flagged.dtype != dtype:
        promoted.append(f"{jnp.dtype(dtype).name}->{flagged.dtype}")
if promoted:
    print(f"REPRODUCED: force_fp32_for_softmax=True changes the output dtype ({', '.join(promoted)})")
    sys.exit(0)
print("NOT REPRODUCED: the output keeps the input dtype with force_fp32_for_softmax=True")
sys.exit(1)
