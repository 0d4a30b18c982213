"""TORCH-CPU-FLASH-NEGATIVE-SCALE-CAUSAL: CPU flash attention with is_causal=True and a scale <= 0
returns NaN rows.

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


def reference(q, k, v, scale):
    """The documented definition in float64: top-left causal mask, then softmax(scale * q k^T) v."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * scale
    lq, lk = s.shape[-2:]
    s = s.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def main() -> int:
    print(f"torch {torch.__version__}")
    rng = np.random.default_rng(8)
    q, k, v = (torch.tensor(rng.normal(size=(1, 1, 3, 8)), dtype=torch.float32) for _ in range(3))
    causal_mask = torch.ones(3, 3, dtype=torch.bool).tril()
    reproduced = []
    for scale in (-0.35, 0.0):
        ref = reference(q, k, v, scale)
        with sdpa_kernel([SDPBackend.MATH]):
            math = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                flash = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
                flash_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask, scale=scale)
        except Exception as exc:  # a clean refusal of the forced kernel is not this bug
            print(f"scale={scale}: FLASH refuses: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        default = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        nan_rows = torch.isnan(flash).any(-1).flatten().nonzero().flatten().tolist()
        print(f"scale={scale}: MATH max err {(math - ref).abs().max().item():.2g}; "
              f"FLASH is_causal NaN rows {nan_rows}; "
              f"FLASH with the same mask as a bool attn_mask max err {(flash_mask - ref).abs().max().item():.2g}; "
              f"default dispatch NaN rows {torch.isnan(default).any(-1).flatten().nonzero().flatten().tolist()}")
        if nan_rows and torch.isfinite(ref).all():
            reproduced.append(f"scale={scale}: rows {nan_rows} NaN")
    if reproduced:
        print("REPRODUCED: CPU flash with is_causal=True gives NaN where the reference is finite ("
              + "; ".join(reproduced) + "); MATH and a bool causal attn_mask are correct")
        return 0
    print("NOT REPRODUCED: CPU flash with is_causal=True is finite for scale -0.35 and 0.0")
    return 1


if __name__ == "__main__":
    sys.exit(main())
