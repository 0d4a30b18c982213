"""PADDLE-SDPA-ZERO-SCALE: paddle.nn.functional.scaled_dot_product_attention on CPU replaces scale=0.0
by 1/sqrt(head_dim) (`scale = scale or ...` in its math path).

Needs only paddlepaddle and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import paddle
    import paddle.nn.functional as F
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def attention(q, k, v, scale):
    """softmax(scale q k^T) v in float64, Paddle's [batch, seq, heads, dim] layout."""
    s = np.einsum("blhd,bmhd->bhlm", q, k) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhlm,bmhd->blhd", w / w.sum(-1, keepdims=True), v)


def main() -> int:
    paddle.set_device("cpu")
    print(f"paddle {paddle.__version__}, NumPy {np.__version__}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 4, 2, 8)) for _ in range(3))
    out = F.scaled_dot_product_attention(*(paddle.to_tensor(a) for a in (q, k, v)), scale=0.0).numpy()
    zero = np.abs(out - attention(q, k, v, 0.0)).max()
    default = np.abs(out - attention(q, k, v, 8 ** -0.5)).max()
    print(f"scale=0.0: max |out - attention(scale=0)| = {zero:.3g}  (the mean of the values)")
    print(f"           max |out - attention(scale=1/sqrt(8))| = {default:.3g}")
    if default < 1e-12 < zero:
        print(f"REPRODUCED: scale=0.0 computes attention with 1/sqrt(8) (to {default:.1g}), off the scale-0 "
              f"result by {zero:.2g}")
        return 0
    print("NOT REPRODUCED: scale=0.0 is honoured")
    return 1


if __name__ == "__main__":
    sys.exit(main())
