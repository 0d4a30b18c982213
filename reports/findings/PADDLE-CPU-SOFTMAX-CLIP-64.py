"""PADDLE-CPU-SOFTMAX-CLIP-64: Paddle's CPU softmax clips x - max(x) at -64, so a masked (-inf) key
keeps the weight e^-64 = 1.6e-28 and a large masked value leaks into
paddle.nn.functional.scaled_dot_product_attention's output.

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


def main() -> int:
    paddle.set_device("cpu")
    print(f"paddle {paddle.__version__}, NumPy {np.__version__}")
    w = F.softmax(paddle.to_tensor(np.array([[0.0, -np.inf, -100.0, -63.0]]))).numpy()[0]
    print(f"softmax([0, -inf, -100, -63]) float64 = {w}  (exact: [1, 0, 3.7e-44, 4.4e-28])")

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 3, 1, 8)) for _ in range(3))
    v[0, 2, 0, :] = 1e30                       # the value of a key every query has masked
    keep = np.ones((1, 1, 3, 3), dtype=bool)
    keep[..., 2] = False
    out = F.scaled_dot_product_attention(*(paddle.to_tensor(a) for a in (q, k, v)),
                                         attn_mask=paddle.to_tensor(keep)).numpy()
    s = np.einsum("blhd,bmhd->bhlm", q[:, :, :, :], k[:, :2]) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhlm,bmhd->blhd", p / p.sum(-1, keepdims=True), v[:, :2])
    err = np.abs(out - ref).max()
    print(f"SDPA, key 2 masked for every query, its value 1e30: max |out - reference| = {err:.3g}")
    if w[1] > 0 and err > 1.0:
        print(f"REPRODUCED: a -inf logit gets softmax weight {w[1]:.2g} (e^-64), and a masked value of 1e30 "
              f"moves the attention output by {err:.3g}")
        return 0
    print("NOT REPRODUCED: masked keys get weight 0")
    return 1


if __name__ == "__main__":
    sys.exit(main())
