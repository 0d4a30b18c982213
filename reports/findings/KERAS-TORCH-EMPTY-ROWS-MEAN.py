"""KERAS-TORCH-EMPTY-ROWS-MEAN: keras.ops.dot_product_attention on the torch backend turns a boolean
mask into a finite bias, so a row whose mask is all False returns the mean of all values, masked
ones included.

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


def main() -> int:
    if keras.backend.backend() != "torch":
        print(f"CANNOT RUN: keras runs the {keras.backend.backend()} backend")
        return 2
    print(f"keras {keras.__version__}, torch {torch.__version__}, NumPy {np.__version__}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 3, 1, 8)).astype(np.float32) for _ in range(3))
    v[0, 2, 0, :] = 1e30                 # a value the mask hides from every row
    keep = np.ones((1, 1, 3, 3), dtype=bool)
    keep[..., 2] = False                 # key 2 is masked for every query
    keep[0, 0, 1, :] = False             # query row 1 sees no key at all
    out = keras.ops.dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                          mask=torch.from_numpy(keep)).numpy()
    others = np.abs(out[0, [0, 2], 0]).max()
    row = out[0, 1, 0]
    print(f"rows that see keys: max |out| = {others:.3g}")
    print(f"empty row: out[:3] = {row[:3]}  (mean of all 3 values: {v[0, :, 0].astype(np.float64).mean(0)[:3]})")
    if np.all(np.abs(row) > 1e28):
        print(f"REPRODUCED: a fully-masked row is {row[0]:.3g}, the mean of all values with the masked 1e30 "
              f"included; the spec asks 0")
        return 0
    print("NOT REPRODUCED: the fully-masked row does not carry the masked value")
    return 1


if __name__ == "__main__":
    sys.exit(main())
