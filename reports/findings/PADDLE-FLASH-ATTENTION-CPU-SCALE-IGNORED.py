"""PADDLE-FLASH-ATTENTION-CPU-SCALE-IGNORED: paddle.nn.functional.flash_attention.flash_attention on CPU
ignores softmax_scale: its math fallback is called without it and uses 1/sqrt(head_dim).

Needs only paddlepaddle and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import paddle
    from paddle.nn.functional.flash_attention import flash_attention
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
    default = 8 ** -0.5
    worst = 0.0
    for scale in (1.0, 0.05, -1.0):
        out, _ = flash_attention(*(paddle.to_tensor(a) for a in (q, k, v)), causal=False, softmax_scale=scale)
        out = out.numpy()
        err = np.abs(out - attention(q, k, v, scale)).max()
        as_default = np.abs(out - attention(q, k, v, default)).max()
        worst = max(worst, err) if as_default < 1e-12 else worst
        print(f"softmax_scale={scale:+}: max |out - attention(given scale)| = {err:.3g}; "
              f"max |out - attention(1/sqrt(8))| = {as_default:.3g}")
    if worst > 1e-6:
        print(f"REPRODUCED: every softmax_scale gives the 1/sqrt(8) result (to 1e-12 or better), off the "
              f"requested one by up to {worst:.2g}")
        return 0
    print("NOT REPRODUCED: softmax_scale is honoured on CPU")
    return 1


if __name__ == "__main__":
    sys.exit(main())
