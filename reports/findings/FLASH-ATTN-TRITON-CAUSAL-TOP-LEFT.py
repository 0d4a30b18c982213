"""FLASH-ATTN-TRITON-CAUSAL-TOP-LEFT: flash-attn-triton's flash_attn_func, which claims the flash-attention 2
API, aligns causal=True to the top-left corner when Lq != Lk (flash-attention 2: bottom-right).

Needs flash-attn-triton 0.1.1, triton 3.3.1 (run through its interpreter on CPU, TRITON_INTERPRET=1;
its interpreter needs NumPy < 2.4), torch and NumPy. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED,
2 CANNOT RUN.
"""
import functools
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
try:
    import numpy as np
    import torch
    import triton
    # The interpreter cannot time the autotuner's configurations: keep the first valid one, untimed.
    triton.autotune = functools.partial(triton.autotune, do_bench=lambda *a, **k: [0.0, 0.0, 0.0])
    from flash_attn_triton import flash_attn_func
    from flash_attn_triton.triton_kernel import attention_kernel
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)
attention_kernel._attn_fwd.early_config_prune = (
    lambda configs, nargs, **kw: [c for c in configs if c.kwargs["BLOCK_N"] <= kw["HEAD_DIM"]][:1])


def attention(q, k, v, visible):
    """softmax(q k^T / sqrt(d)) v in float64 over the visible keys ((Lq, Lk) bool), 0 for rows with none."""
    q, k, v = (np.asarray(x.float(), dtype=np.float64) for x in (q, k, v))
    s = np.einsum("blhd,bmhd->bhlm", q, k) / np.sqrt(q.shape[-1])
    s = np.where(visible, s, -np.inf)
    m = np.where(visible.any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
    w = np.exp(s - m)
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhlm,bmhd->blhd", w, v)


def causal(lq, lk, bottom_right):
    """Query i sees key j when j <= i (top-left) or j <= i + lk - lq (bottom-right)."""
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq if bottom_right else 0)


def run(q, k, v):
    try:
        return np.asarray(flash_attn_func(q, k, v, causal=True).float(), dtype=np.float64)
    except Exception as exc:  # the interpreter of triton 3.3.1 fails on NumPy >= 2.4
        if "0-dimensional" in str(exc):
            print(f"CANNOT RUN: triton's interpreter fails on NumPy {np.__version__} (use NumPy < 2.4)")
            sys.exit(2)
        raise


def main() -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}, NumPy {np.__version__}")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 1, 16, generator=g).half()
    k = torch.randn(1, 8, 1, 16, generator=g).half()
    v = torch.randn(1, 8, 1, 16, generator=g).half()
    errors = {}
    for lq, lk in ((4, 8), (8, 4)):
        out = run(q[:, :lq], k[:, :lk], v[:, :lk])
        for name, br in (("bottom-right", True), ("top-left", False)):
            errors[lq, lk, name] = np.abs(out - attention(q[:, :lq], k[:, :lk], v[:, :lk], causal(lq, lk, br))).max()
            print(f"Lq={lq}, Lk={lk}: max |out - causal {name:12s} attention| = {errors[lq, lk, name]:.3g}")
        if lq > lk:
            print(f"  rows 0..{lq - lk - 1} see no key bottom-right (flash-attention 2 outputs 0): "
                  f"max |out| there = {np.abs(out[:, :lq - lk]).max():.3g}")
    if errors[4, 8, "top-left"] < 0.01 and errors[4, 8, "bottom-right"] > 0.05:
        print(f"REPRODUCED: causal=True with Lq=4, Lk=8 is top-left attention (to {errors[4, 8, 'top-left']:.1g}), "
              f"off the flash-attention 2 (bottom-right) output by {errors[4, 8, 'bottom-right']:.2g}; "
              f"with Lq=8, Lk=4 it is off by {errors[8, 4, 'bottom-right']:.2g}")
        return 0
    print("NOT REPRODUCED: causal=True with Lq=4, Lk=8 is not top-left")
    return 1


if __name__ == "__main__":
    sys.exit(main())
