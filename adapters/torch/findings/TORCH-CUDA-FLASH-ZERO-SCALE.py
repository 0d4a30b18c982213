"""torch's CUDA flash-attention path with a scale <= 0 (and cuDNN with scale = 0): NaN in every element.

Needs torch with a CUDA device. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
With scale = 0 every logit is 0, so each row's weights are uniform and the output is the mean of V's
rows (float64 MATH gives exactly that). Each SDPA backend is forced in turn on the same float16 and
bfloat16 inputs at scales 0, 1e-30 and -0.354, and SDPA is also called without forcing a backend.
"""
from __future__ import annotations

import json
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def main() -> int:
    if not torch.cuda.is_available():
        print("CANNOT RUN: no CUDA device (the defect is in the CUDA flash and cuDNN kernels)")
        return 2
    print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 64, generator=g, dtype=torch.float64) for s in (3, 6, 6))
    nan_flash_zero = False
    for dtype in (torch.float16, torch.bfloat16):
        dq, dk, dv = (t.to("cuda", dtype) for t in (q, k, v))
        for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.CUDNN_ATTENTION, None):
            for scale in (0.0, 1e-30, -0.354):
                ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
                try:
                    if backend is None:
                        out = F.scaled_dot_product_attention(dq, dk, dv, scale=scale)
                    else:
                        with sdpa_kernel([backend]):
                            out = F.scaled_dot_product_attention(dq, dk, dv, scale=scale)
                    torch.cuda.synchronize()
                    o = out.double().cpu()
                    row = {"nan": f"{int(torch.isnan(o).sum())} of {o.numel()}",
                           "max_abs_err_vs_float64": float((o - ref).abs().nan_to_num(float("inf")).max())}
                    if backend == SDPBackend.FLASH_ATTENTION and scale == 0.0 and torch.isnan(o).all():
                        nan_flash_zero = True
                except RuntimeError as exc:
                    row = {"raised": str(exc).splitlines()[0][:120]}
                name = "default dispatch" if backend is None else backend.name
                print(json.dumps({"dtype": str(dtype), "backend": name, "scale": scale, **row}))
    if nan_flash_zero:
        print("REPRODUCED: forced FLASH_ATTENTION returns NaN in every element with scale=0 "
              "(the mean of V is the answer)")
        return 0
    print("NOT REPRODUCED: FLASH_ATTENTION with scale=0 returned a finite result")
    return 1


if __name__ == "__main__":
    sys.exit(main())
