#!/usr/bin/env python3
"""SAGEATTN-KV-TAIL-UNMASKED: sageattention 1.0.6's `sageattn` gives the padding keys of the last 64-key
block a logit of 0 when kv_len is not a multiple of 64, so they join every row's softmax denominator.
With V = 1 every output must be 1 (the weights sum to 1); with kv_len = 65 it is about 0.6.
Needs torch, triton and sageattention. Without CUDA it runs the Triton kernels in the interpreter
(TRITON_INTERPRET=1) and re-executes itself with `python -O`, because `sageattn` asserts q.is_cuda.
Exit 0 (REPRODUCED) while the behaviour lasts, 1 once fixed, 2 if it cannot run."""
import os
import sys

try:
    import torch
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)
if not torch.cuda.is_available() and (os.environ.get("TRITON_INTERPRET") != "1" or not sys.flags.optimize):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    os.execve(sys.executable, [sys.executable, "-O", *sys.argv], env)
try:
    from sageattention import sageattn
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)

device = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator().manual_seed(0)
worst = {}
for lk in (64, 65, 70, 128, 129):
    q = torch.randn(1, 1, 16, 64, generator=gen).half().to(device)
    k = torch.randn(1, 1, lk, 64, generator=gen).half().to(device)
    v = torch.ones(1, 1, lk, 64, dtype=torch.float16, device=device)
    out = sageattn(q, k, v, tensor_layout="HND", is_causal=False)
    worst[lk] = float((out.float() - 1.0).abs().max())
print("max |out - 1| with V = 1, by kv_len:", ", ".join(f"{lk}: {e:.3g}" for lk, e in worst.items()))
bad = [lk for lk, e in worst.items() if e > 0.01]       # float16 P: |out - 1| <= a few 2^-11 when correct
if bad:
    print(f"REPRODUCED: kv_len {bad} (not multiples of 64) give outputs off by up to {max(worst[b] for b in bad):.3g}; "
          f"kv_len 64 and 128 by {worst[64]:.2g}, {worst[128]:.2g}")
    sys.exit(0)
print("NOT REPRODUCED: every kv_len gives outputs of 1 within float16 rounding")
sys.exit(1)
