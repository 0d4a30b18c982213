"""TORCH-FLEX-CPU-KV-OVERREAD: torch.compile(flex_attention) on CPU reads memory past the end of K and V
for the last head, and what it finds there reaches that head's output.

Float32, q/k/v (1, 2, 8, 16), no mask, no score_mod. The same finite K and V are passed twice: once in
their own storage, once as the first elements of a larger buffer whose remaining elements are NaN (the
tensors themselves are unchanged and contiguous). A kernel that reads only K and V gives the same
finite output both times.

Needs only torch (with a C++ compiler, which torch.compile needs on CPU). Points TORCHINDUCTOR_CACHE_DIR at a
fresh directory, so no cached kernel is involved. Inductor generates the kernel for the CPU's vector ISA, and
the over-read was measured only where torch's CPU capability is AVX2; elsewhere the script says CANNOT RUN
rather than NOT REPRODUCED. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
from __future__ import annotations

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

B, H, L, D = 1, 2, 8, 16
MEASURED_ON = ("AVX2",)          # torch.backends.cpu.get_cpu_capability() where the over-read was measured


def followed_by_nan(x: torch.Tensor) -> torch.Tensor:
    """`x`, contiguous, stored at the start of a buffer that holds NaN after it."""
    buf = torch.full((x.numel() + 4096,), float("nan"), dtype=x.dtype)
    buf[: x.numel()] = x.reshape(-1)
    return buf[: x.numel()].view(x.shape)


def main() -> int:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    if torch.backends.cpu.get_cpu_capability() not in MEASURED_ON:
        print(f"CANNOT RUN: measured only with CPU capability {', '.join(MEASURED_ON)}; this CPU generates "
              f"{torch.backends.cpu.get_cpu_capability()} code, another kernel")
        return 2
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=D ** -0.5)
    fn = torch.compile(flex_attention)
    hit = False
    for name, args in (("own storage", (q, k, v)), ("NaN after K", (q, followed_by_nan(k), v)),
                       ("NaN after V", (q, k, followed_by_nan(v)))):
        out = fn(*args, scale=D ** -0.5).double()
        wrong = ~((out - ref).abs() <= 1e-5)   # NaN counts as wrong
        heads = sorted({h for h in wrong.any(-1).nonzero()[:, 1].tolist()})
        print(f"  {name}: {int((~torch.isfinite(out)).sum())} of {out.numel()} outputs non-finite, "
              f"{int(wrong.any(-1).sum())} of {B * H * L} rows wrong (heads {heads}), "
              f"max error {(out - ref).abs().nan_to_num(float('inf')).max().item():.3g}")
        hit |= name != "own storage" and bool(wrong.any())
    if hit:
        print("REPRODUCED: memory after K or V reaches the output of compiled CPU flex_attention")
        return 0
    print("NOT REPRODUCED: the output depends only on q, k and v")
    return 1


if __name__ == "__main__":
    sys.exit(main())
