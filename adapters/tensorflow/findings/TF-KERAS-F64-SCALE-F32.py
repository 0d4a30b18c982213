"""TF-KERAS-F64-SCALE-F32: keras.ops.dot_product_attention on the TensorFlow backend rounds the
scale to float32 for float64 inputs (the default 1/sqrt(H) and a Python float `scale=` alike).

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


def reference(q, k, v, scale):
    s = np.einsum("btnh,bsnh->bnts", q, k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def main() -> int:
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, backend {keras.backend.backend()}")
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(1, 8, 1, 8)) for _ in range(3))  # float64, head_dim 8
    # A float64 computation of this size is accurate to about 1e-15; rounding the scale to
    # float32 (relative error up to 2**-24 = 6e-8) moves the logits, and the output, by ~1e-8.
    # Criterion: the output misses the float64 reference by more than 1e-10 (10^5 x float64
    # rounding) but matches the reference built with the float32-rounded scale to 1e-13.
    found = []
    for given in (None, 0.1):
        exact = 1 / np.sqrt(8) if given is None else given
        out = np.asarray(ops.dot_product_attention(q, k, v, scale=given))
        err = np.abs(out - reference(q, k, v, exact)).max()
        err32 = np.abs(out - reference(q, k, v, float(np.float32(exact)))).max()
        print(f"scale={given!s:>4}: output dtype {out.dtype}; max err vs float64 reference {err:.3g}; "
              f"vs reference with the scale rounded to float32 {err32:.3g}")
        if err > 1e-10 and err32 < 1e-13:
            found.append(f"scale={given}: {err:.2g}")
    exact_scale = np.asarray(ops.dot_product_attention(q, k, v, scale=0.5))
    print(f"scale= 0.5 (exactly a float32): max err {np.abs(exact_scale - reference(q, k, v, 0.5)).max():.3g}")
    if found:
        print("REPRODUCED: float64 attention uses a float32-rounded scale (" + "; ".join(found)
              + " against a float64 accuracy of ~1e-15)")
        return 0
    print("NOT REPRODUCED: float64 attention uses the float64 scale")
    return 1


if __name__ == "__main__":
    sys.exit(main())
