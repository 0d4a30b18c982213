"""torch.compile(flex_attention) with a NumPy float64 `scale`: BackendCompilerFailed.

Needs only torch and NumPy (CPU is enough; CUDA is used when present). Exit status: 0 REPRODUCED,
1 NOT REPRODUCED, 2 CANNOT RUN. np.float64 is a subclass of Python float, and `1 / np.sqrt(d)` is a
natural way to write a scale; the same call with float(scale) compiles and runs.
"""
from __future__ import annotations

import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def main() -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch", torch.__version__, "on", torch.cuda.get_device_name() if dev == "cuda" else "cpu")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g, dtype=torch.float64) for _ in range(3))
    args = [t.to(dev, torch.float32) for t in (q, k, v)]
    fn = torch.compile(flex_attention, dynamic=False)
    outcome = {}
    for scale in (0.25, np.float64(0.25)):
        try:
            out = fn(*args, scale=scale)
            ref = F.scaled_dot_product_attention(q, k, v, scale=float(scale))
            outcome[type(scale).__name__] = None
            print(f"scale={scale!r}: ran, max |out - float64 SDPA| = {(out.double().cpu() - ref).abs().max():.2e}")
        except Exception as exc:  # noqa: BLE001 - what it raises is the finding
            msg = " ".join(str(exc).split())[:160]
            outcome[type(scale).__name__] = f"{type(exc).__name__}: {msg}"
            print(f"scale={scale!r}: raised {outcome[type(scale).__name__]}")
    if outcome["float"] is None and outcome["float64"] is not None:
        print("REPRODUCED: compiled flex_attention runs with scale=0.25 and fails to compile with "
              "scale=np.float64(0.25)")
        return 0
    print(f"NOT REPRODUCED: float -> {outcome['float'] or 'ran'}, np.float64 -> {outcome['float64'] or 'ran'}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
