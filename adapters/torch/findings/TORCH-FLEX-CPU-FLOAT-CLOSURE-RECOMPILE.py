"""TORCH-FLEX-CPU-FLOAT-CLOSURE-RECOMPILE: torch.compile(flex_attention) on CPU with a score_mod that closes
over a Python float (a softcap) compiles for the first value and raises for every later one: dynamo
recompiles with the float as a dynamic input, and inductor's CPU flex lowering fails with
`LoweringException: RuntimeError: unbacked_bindings`.

Needs only torch (with a C++ compiler, which torch.compile needs on CPU). Points TORCHINDUCTOR_CACHE_DIR at a
fresh directory. Exit status: 0 REPRODUCED, 1 NOT REPRODUCED, 2 CANNOT RUN.
"""
from __future__ import annotations

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
try:
    import torch
    from torch.nn.attention.flex_attention import flex_attention
except ImportError as exc:
    print(f"CANNOT RUN: {exc}")
    sys.exit(2)


def softcap_mod(cap: float):
    """Gemma2's logit soft-capping as transformers' flex_attention_forward writes its score_mod."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def main() -> int:
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    fn = torch.compile(flex_attention)
    failed = []
    for cap in (0.5, 2.0):
        try:
            out = fn(q, k, v, score_mod=softcap_mod(cap))
        except Exception as exc:  # noqa: BLE001 (any failure of an ordinary call is the defect)
            print(f"  softcap {cap}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            failed.append(cap)
            continue
        logits = cap * torch.tanh(q @ k.transpose(-1, -2) / 8 ** 0.5 / cap)
        print(f"  softcap {cap}: ok, max error {(out - torch.softmax(logits, -1) @ v).abs().max().item():.3g}")
    if failed:
        print(f"REPRODUCED: compiled flex_attention raised for softcap {failed} after compiling for 0.5")
        return 0
    print("NOT REPRODUCED: both softcap values compiled and ran")
    return 1


if __name__ == "__main__":
    sys.exit(main())
