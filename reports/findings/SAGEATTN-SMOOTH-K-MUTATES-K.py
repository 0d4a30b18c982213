#!/usr/bin/env python3
"""SAGEATTN-SMOOTH-K-MUTATES-K: sageattention 1.0.6's `sageattn` (smooth_k=True, the default) subtracts
the mean of K over the sequence from the caller's k tensor in place (`k -= km`), so the caller's keys
change and a second call with the same tensors smooths an already smoothed K.
Needs torch, triton and sageattention; without CUDA it uses the Triton interpreter and `python -O`
(sageattn asserts q.is_cuda). Exit 0 (REPRODUCED) while the behaviour lasts, 1 once fixed, 2 if it cannot run."""
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
q = torch.randn(1, 1, 64, 64, generator=gen).half().to(device)
k = (torch.randn(1, 1, 64, 64, generator=gen) + 2.0).half().to(device)
v = torch.randn(1, 1, 64, 64, generator=gen).half().to(device)
before = k.clone()
sageattn(q, k, v, tensor_layout="HND", is_causal=False)
moved = float((k.float() - before.float()).abs().max())
if moved > 0:
    print(f"REPRODUCED: the caller's k changed by up to {moved:.3g} (its mean over the sequence was subtracted in place)")
    sys.exit(0)
print("NOT REPRODUCED: k is unchanged after the call")
sys.exit(1)
