"""torch's cuDNN SDPA path fails on an additive bias broadcast over queries and keys, shape (B, H, 1, 1).

Needs torch with a CUDA device. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
torch's kernel selection accepts the call (torch._fused_sdp_choice picks cuDNN when forced), then the
cuDNN graph fails at execution: with CUDA_LAUNCH_BLOCKING=1 as RuntimeError "Expected
mha_graph.execute(...).is_good() to be true", without it as "CUDA error: misaligned address", which
poisons the process's CUDA context. Each variant runs in a fresh process, forced to
SDPBackend.CUDNN_ATTENTION, and is compared with float64 MATH on the same inputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

VARIANTS = {
    # name: (B, Hq, Hkv, Lq, Lk, D, bias shape or None)
    "as met: gqa, bias (B,Hq,1,1), Lk=47": (2, 6, 3, 1, 47, 96, "B,H,1,1"),
    "no gqa (Hkv=Hq)": (2, 6, 6, 1, 47, 96, "B,H,1,1"),
    "Lk=48": (2, 6, 3, 1, 48, 96, "B,H,1,1"),
    "D=64": (2, 6, 3, 1, 47, 64, "B,H,1,1"),
    "Lq=2": (2, 6, 3, 2, 47, 96, "B,H,1,1"),
    "same bias expanded to (B,Hq,Lq,Lk), contiguous": (2, 6, 3, 1, 47, 96, "B,H,Lq,Lk"),
    "no bias": (2, 6, 3, 1, 47, 96, None),
}


def one(name: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, Hkv, Lq, Lk, D, bias_shape = VARIANTS[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64)
               for s in ((B, H, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
    bias = None
    if bias_shape:
        small = torch.randn((B, H, 1, 1), generator=g, dtype=torch.float64)
        bias = small if bias_shape == "B,H,1,1" else small.expand(B, H, Lq, Lk).contiguous()
    gqa = Hkv != H
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.125, enable_gqa=gqa)
    dev = lambda t: None if t is None else t.to("cuda", torch.bfloat16)  # noqa: E731
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(dev(q), dev(k), dev(v), attn_mask=dev(bias), scale=0.125,
                                                 enable_gqa=gqa)
        torch.cuda.synchronize()
        err = (out.double().cpu() - ref).abs().max().item()
        print(json.dumps({"variant": name, "outcome": "ran", "max_abs_err_vs_float64": err}))
    except Exception as exc:  # noqa: BLE001 - what it raises is the finding
        print(json.dumps({"variant": name, "outcome": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}))


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"CANNOT RUN: {exc}")
        return 2
    if not torch.cuda.is_available():
        print("CANNOT RUN: no CUDA device (the defect is in the cuDNN attention path)")
        return 2
    print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    outcomes = {}
    for name in VARIANTS:
        r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, env=env, timeout=300)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else json.dumps(
            {"variant": name, "outcome": f"exit {r.returncode}: {r.stderr[-200:]}"})
        print(line)
        outcomes[name] = json.loads(line)["outcome"]
    if outcomes["as met: gqa, bias (B,Hq,1,1), Lk=47"] != "ran" and \
            outcomes["same bias expanded to (B,Hq,Lq,Lk), contiguous"] == "ran":
        print("REPRODUCED: the cuDNN path fails on a (B, H, 1, 1) bias and runs the same bias expanded")
        return 0
    print("NOT REPRODUCED: the cuDNN path ran the broadcast bias (or failed on the expanded one too)")
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
        sys.exit(0)
    sys.exit(main())
