"""TORCH-FUSED-RANK1-MASK: F.scaled_dot_product_attention raises IndexError for a 1-D attn_mask of
shape (S,) when the fused CPU kernel is considered (default dispatch or FLASH_ATTENTION forced).

Needs only torch and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
import contextlib
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def main() -> int:
    print(f"torch {torch.__version__}")
    rng = np.random.default_rng(5)
    q = torch.tensor(rng.normal(size=(2, 2, 4, 8)), dtype=torch.float32)
    k = torch.tensor(rng.normal(size=(2, 2, 6, 8)), dtype=torch.float32)
    v = torch.tensor(rng.normal(size=(2, 2, 6, 8)), dtype=torch.float32)
    mask_1d = torch.arange(6) != 5  # hide the last key; broadcasts to (B, H, L, S)
    with sdpa_kernel([SDPBackend.MATH]):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_1d)
    print(f"MATH with the (6,) bool mask: returns {tuple(expected.shape)}")

    index_errors = []
    for name, ctx in (("default dispatch", contextlib.nullcontext),
                      ("FLASH_ATTENTION", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION]))):
        for mask_name, mask in (("bool (6,)", mask_1d),
                                ("float (6,)", torch.zeros(6).masked_fill(~mask_1d, float("-inf")))):
            try:
                with ctx():
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                print(f"{name}, {mask_name} mask: returns, max |out - MATH| = "
                      f"{(out - expected).abs().max().item():.2g}")
            except IndexError as exc:
                print(f"{name}, {mask_name} mask: IndexError: {exc}")
                index_errors.append(f"{name} with a {mask_name} mask")
            except Exception as exc:  # a clean refusal ("No available kernel") is not this bug
                print(f"{name}, {mask_name} mask: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out_2d = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_1d.reshape(1, 6))
    print(f"FLASH_ATTENTION with the same mask reshaped to (1, 6): max |out - MATH| = "
          f"{(out_2d - expected).abs().max().item():.2g}")
    if index_errors:
        print("REPRODUCED: IndexError (Dimension out of range) from SDPA kernel selection for "
              + "; ".join(index_errors) + "; MATH accepts the mask")
        return 0
    print("NOT REPRODUCED: a (S,) attn_mask no longer raises IndexError")
    return 1


if __name__ == "__main__":
    sys.exit(main())
