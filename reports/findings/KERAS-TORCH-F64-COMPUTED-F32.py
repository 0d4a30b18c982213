"""KERAS-TORCH-F64-COMPUTED-F32: keras.ops.dot_product_attention on the torch backend computes float64
inputs in float32 and returns float32, because keras.backend.result_type("float64", "float64") is
"float32".

Needs keras 3 and torch (KERAS_BACKEND=torch is set here) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"
try:
    import keras
    import numpy as np
    import torch
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def attention(q, k, v):
    """softmax(q k^T / sqrt(H)) v in float64, keras's (B, T, N, H) layout."""
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bnts,bsnh->btnh", w / w.sum(-1, keepdims=True), v)


def main() -> int:
    if keras.backend.backend() != "torch":
        print(f"CANNOT RUN: keras runs the {keras.backend.backend()} backend")
        return 2
    print(f"keras {keras.__version__}, torch {torch.__version__}, NumPy {np.__version__}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 6, 2, 16)) for _ in range(3))
    out = keras.ops.dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)))
    err = np.abs(out.double().numpy() - attention(q, k, v)).max()
    rt = keras.backend.result_type("float64", "float64")
    mm = keras.ops.matmul(torch.from_numpy(q[0, 0]), torch.from_numpy(k[0, 0].T)).dtype
    print(f"inputs float64 -> output {out.dtype}; max |out - float64 reference| = {err:.3g}")
    print(f'keras.backend.result_type("float64", "float64") = {rt!r}; keras.ops.matmul(float64, float64) -> {mm}')
    if out.dtype == torch.float32 or err > 1e-12:
        print(f"REPRODUCED: float64 attention returns {out.dtype}, off the float64 reference by {err:.2g} "
              f"(float64 arithmetic would be within ~1e-15)")
        return 0
    print("NOT REPRODUCED: float64 inputs give a float64 output at float64 accuracy")
    return 1


if __name__ == "__main__":
    sys.exit(main())
