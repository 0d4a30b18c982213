"""FLASH-ATTN-TRITON-NEGATIVE-SCALE: flash-attn-triton's non-causal flash_attn_func returns inf or NaN for
a negative softmax_scale: its running maximum is max(QK^T) * scale, the minimum when scale < 0.

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


def attention(q, k, v, scale):
    """softmax(scale q k^T) v in float64, (B, L, H, D) layout."""
    q, k, v = (np.asarray(x.float(), dtype=np.float64) for x in (q, k, v))
    s = np.einsum("blhd,bmhd->bhlm", q, k) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhlm,bmhd->blhd", w / w.sum(-1, keepdims=True), v)


def run(q, k, v, scale, causal):
    try:
        return np.asarray(flash_attn_func(q, k, v, softmax_scale=scale, causal=causal).float(), dtype=np.float64)
    except Exception as exc:  # the interpreter of triton 3.3.1 fails on NumPy >= 2.4
        if "0-dimensional" in str(exc):
            print(f"CANNOT RUN: triton's interpreter fails on NumPy {np.__version__} (use NumPy < 2.4)")
            sys.exit(2)
        raise


def main() -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}, NumPy {np.__version__}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 1, 16, generator=g).half() for _ in range(3))
    bad = {}
    for scale in (1.0, -0.25, -1.0):
        out = run(q, k, v, scale, causal=False)
        ref = attention(q, k, v, scale)
        finite = np.isfinite(out)
        err = np.abs(out[finite] - ref[finite]).max() if finite.any() else float("nan")
        bad[scale] = int((~finite).sum())
        print(f"softmax_scale={scale:+.2f}: {bad[scale]} of {out.size} outputs not finite; "
              f"max |out - reference| over the finite ones = {err:.3g}; max |reference| = {np.abs(ref).max():.3g}")
    if bad[1.0] == 0 and bad[-1.0] > 0:
        print(f"REPRODUCED: softmax_scale=-1 gives {bad[-1.0]} non-finite outputs of {q.numel()} "
              f"(the reference is finite, |out| <= {np.abs(attention(q, k, v, -1.0)).max():.2g}); +1 gives none, and -0.25 only {bad[-0.25]}")
        return 0
    print("NOT REPRODUCED: a negative softmax_scale gives a finite output")
    return 1


if __name__ == "__main__":
    sys.exit(main())
