"""FLASH-ATTN-TRITON-PADDED-KEYS: flash-attn-triton's non-causal flash_attn_func attends to the zero
keys it pads K with, and drops keys past the padded query length.

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


def attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v in float64, (B, L, H, D) layout."""
    q, k, v = (np.asarray(x.float(), dtype=np.float64) for x in (q, k, v))
    s = np.einsum("blhd,bmhd->bhlm", q, k) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhlm,bmhd->blhd", w / w.sum(-1, keepdims=True), v)


def run(q, k, v):
    try:
        return np.asarray(flash_attn_func(q, k, v, causal=False).float(), dtype=np.float64)
    except Exception as exc:  # the interpreter of triton 3.3.1 fails on NumPy >= 2.4
        if "0-dimensional" in str(exc):
            print(f"CANNOT RUN: triton's interpreter fails on NumPy {np.__version__} (use NumPy < 2.4)")
            sys.exit(2)
        raise


def main() -> int:
    print(f"triton {triton.__version__}, torch {torch.__version__}, NumPy {np.__version__}")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 128, 1, 16, generator=g).half()
    k = torch.randn(1, 200, 1, 16, generator=g).half()
    v = torch.randn(1, 200, 1, 16, generator=g).half()
    zeros = torch.zeros(1, 78, 1, 16).half()

    out50 = run(q, k[:, :50], v[:, :50])
    err50 = np.abs(out50 - attention(q, k[:, :50], v[:, :50])).max()
    pad50 = np.abs(out50 - attention(q, torch.cat([k[:, :50], zeros], 1), torch.cat([v[:, :50], zeros], 1))).max()
    print(f"Lq=128, Lk=50:  max |out - attention(q, K, V)|                    = {err50:.3g}")
    print(f"                max |out - attention(q, K + 78 zero keys, V + 78 zero values)| = {pad50:.3g}")
    out200 = run(q, k, v)
    err200 = np.abs(out200 - attention(q, k, v)).max()
    first = np.abs(out200 - attention(q, k[:, :128], v[:, :128])).max()
    print(f"Lq=128, Lk=200: max |out - attention(q, K, V)|                    = {err200:.3g}")
    print(f"                max |out - attention(q, K[:128], V[:128])|        = {first:.3g}")
    if err50 > 0.05 and pad50 < 0.01:
        print(f"REPRODUCED: with Lk=50 the output is attention over K plus 78 zero keys (to {pad50:.1g}; "
              f"off the true output by {err50:.2g}); with Lk=200 it is attention over the first 128 keys "
              f"(to {first:.1g}; off by {err200:.2g})")
        return 0
    print("NOT REPRODUCED: the non-causal output with Lk=50 does not attend zero keys")
    return 1


if __name__ == "__main__":
    sys.exit(main())
