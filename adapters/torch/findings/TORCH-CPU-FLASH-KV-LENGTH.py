"""TORCH-CPU-FLASH-KV-LENGTH: CPU flash attention accepts K and V of different lengths and reads
key rows from outside K.

Needs only torch and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def attention(q, k, v):
    """softmax(q k^T / sqrt(E)) v in float64, the documented definition."""
    s = q @ k.transpose(-1, -2) / np.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def main() -> int:
    print(f"torch {torch.__version__}")
    rng = np.random.default_rng(0)
    q = torch.tensor(rng.normal(size=(1, 2, 4, 8)))
    # K has 5 rows and V 6. K is a view of the first 5 rows of a 6-row buffer, so that the row
    # the kernel reads past the end of K is ordinary memory we control (a contiguous K would
    # make the same read go past its allocation).
    k_buffer = torch.tensor(rng.normal(size=(1, 2, 6, 8)))
    k = k_buffer[:, :, :5, :]
    v = torch.tensor(rng.normal(size=(1, 2, 6, 8)))

    try:
        with sdpa_kernel([SDPBackend.MATH]):
            F.scaled_dot_product_attention(q, k, v)
        print("MATH:  returned (it raised in torch 2.13)")
    except Exception as exc:  # any error is the documented outcome for an invalid call
        print(f"MATH:  raises {type(exc).__name__}: {str(exc).splitlines()[0]}")

    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(q, k, v)
    except Exception as exc:  # any error is the documented outcome for an invalid call
        print(f"FLASH: raises {type(exc).__name__}: {str(exc).splitlines()[0]}")
        print("NOT REPRODUCED: the CPU flash path rejects K with 5 rows and V with 6")
        return 1
    print(f"FLASH: returned an output of shape {tuple(out.shape)}")

    try:
        default = F.scaled_dot_product_attention(q, k, v)
        print(f"default dispatch (no sdpa_kernel): returned shape {tuple(default.shape)}")
    except Exception as exc:  # any error is the documented outcome for an invalid call
        print(f"default dispatch (no sdpa_kernel): raises {str(exc).splitlines()[0]}")

    over_read = (out - attention(q, k_buffer, v)).abs().max().item()
    truncated = (out - attention(q, k, v[:, :, :5])).abs().max().item()
    print(f"max |out - attention(q, K buffer incl. row 5 outside K, V)| = {over_read:.3g}")
    print(f"max |out - attention(q, K, V[:5])|                          = {truncated:.3g}")
    k_buffer[:, :, 5, :] *= -1.0  # change only memory that is not part of K
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out2 = F.scaled_dot_product_attention(q, k_buffer[:, :, :5, :], v)
    moved = (out2 - out).abs().max().item()
    print(f"changing the row after K (K itself unchanged) moves the output by {moved:.3g}")
    print(f"REPRODUCED: CPU flash accepted K (5 rows) and V (6 rows) and read a 6th key row from "
          f"outside K (output matches attention over that row to {over_read:.1g}; moving it moves "
          f"the output by {moved:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
