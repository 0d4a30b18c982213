"""TF-KERAS-MQA-RAISES: keras.ops.dot_product_attention on the TensorFlow backend raises for
multi-query attention (one key/value head shared by several query heads), which its docstring
promises.

Needs only keras (TensorFlow backend), tensorflow and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
try:
    import numpy as np
    import tensorflow as tf
    import keras
    from keras import ops
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def reference(q, k, v):
    """Each query head n uses key/value head n // (N // K) (the docstring's GQA/MQA grouping)."""
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def main() -> int:
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, backend {keras.backend.backend()}")
    rng = np.random.default_rng(11)
    q = rng.normal(size=(1, 4, 4, 8)).astype("float32")  # 4 query heads
    for kv_heads in (2, 1):
        k, v = (rng.normal(size=(1, 6, kv_heads, 8)).astype("float32") for _ in range(2))
        try:
            out = np.asarray(ops.dot_product_attention(q, k, v))
        except Exception as exc:  # tf.einsum's InvalidArgumentError
            message = str(exc).splitlines()[0]
            print(f"K={kv_heads} key/value head(s): {type(exc).__name__}: {message}")
            if kv_heads == 1:
                print(f"REPRODUCED: multi-query attention (4 query heads, 1 key/value head) raises "
                      f"{type(exc).__name__}; 2 key/value heads work")
                return 0
            continue
        err = np.abs(out - reference(q, k, v)).max()
        print(f"K={kv_heads} key/value head(s): returns, max |out - reference| = {err:.2g}")
        if kv_heads == 1 and err > 1e-5:  # float32 attention of this size is accurate to ~1e-6
            print(f"REPRODUCED: multi-query attention no longer raises but is wrong (max err {err:.2g})")
            return 0
    print("NOT REPRODUCED: multi-query attention returns the reference result")
    return 1


if __name__ == "__main__":
    sys.exit(main())
