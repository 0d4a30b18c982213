"""MLX-FAST-SDPA-EMPTY-ROWS: mx.fast.scaled_dot_product_attention gives a query row that sees no
key the mean of all values (masked ones included) under a boolean mask, and NaN under an additive
-inf mask.

Needs only mlx (CPU build on Linux: mlx and mlx-cpu) and NumPy.
Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import mlx.core as mx
    import numpy as np
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def main() -> int:
    print(f"mlx {mx.__version__}, device {mx.default_device()}")
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 1, 3, 8)).astype(np.float32)
    k = rng.normal(size=(1, 1, 5, 8)).astype(np.float32)
    v = rng.normal(size=(1, 1, 5, 8)).astype(np.float32)
    v[0, 0, 4, :] = 1e30          # a value the mask hides from every row
    keep = np.ones((1, 1, 3, 5), dtype=bool)
    keep[..., 4] = False          # key 4 is masked for every query
    keep[0, 0, 1, :] = False      # query row 1 sees no key at all
    bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    args = [mx.array(a) for a in (q, k, v)]
    out_bool = np.array(mx.fast.scaled_dot_product_attention(*args, scale=8 ** -0.5, mask=mx.array(keep)))
    out_bias = np.array(mx.fast.scaled_dot_product_attention(*args, scale=8 ** -0.5, mask=mx.array(bias)))

    row_bool, row_bias = out_bool[0, 0, 1], out_bias[0, 0, 1]
    others = np.abs(out_bool[0, 0, [0, 2]]).max()
    mean_all = v[0, 0].astype(np.float64).mean(axis=0)
    print(f"rows that see keys: max |out| = {others:.3g} (the masked 1e30 does not reach them)")
    print(f"bool mask, empty row:  out[:3] = {row_bool[:3]}  (mean of all 5 values: {mean_all[:3]})")
    print(f"-inf bias, empty row:  out[:3] = {row_bias[:3]}")
    leaked = bool(np.all(np.abs(row_bool) > 1e28))
    nan = bool(np.isnan(row_bias).all())
    if leaked or nan:
        print(f"REPRODUCED: a fully-masked row is {row_bool[0]:.3g} (mean of all values, the masked 1e30 "
              f"included) under a bool mask and {'NaN' if nan else row_bias[0]} under a -inf additive mask; "
              f"the spec asks 0 for both")
        return 0
    print("NOT REPRODUCED: the fully-masked row is neither the mean of all values nor NaN")
    return 1


if __name__ == "__main__":
    sys.exit(main())
