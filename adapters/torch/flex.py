"""torch `flex_attention`: masks as a `mask_mod`, bias as a `score_mod`, LSE exposed.

Masking is expressed natively (not pre-folded): the boolean mask, causal
alignment (bottom-right offset per batch element from the padding lengths) and
padding all become one `mask_mod`, so flex's own block-mask machinery is what
is tested. On CPU (torch 2.13) flex runs only eagerly, through its unfused
implementation, forward only: `torch.compile` on CPU refuses `return_lse` and
backward ("FlexAttention does not support backward on CPU"). On CUDA it runs
compiled, which is the fused Triton kernel.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

try:  # torch >= 2.9 asks for the LSE through return_aux; older versions through return_lse
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover (depends on the installed torch)
    AuxRequest = None

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import KernelError, Result
from attnconf.adapters.torch.convert import dtype_name, to_numpy, to_tensor
from attnconf.adapters.torch.sdpa import TorchAdapter, _clean, _equal_over_batch, _input

FLEX_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                       "gqa", "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "lse", "grads", "dbias",
                       "noncontiguous", "broadcast_kv"})
_compiled: Any = None
CUDA_MIN_HEAD_DIM = 16


def _compiled_flex():
    global _compiled
    if _compiled is None:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


class FlexAdapter(TorchAdapter):
    name = "torch:flex"
    # Eager flex on CPU runs its unfused path at ~40 ms a call (measured): a third of the examples.
    example_budget = 0.3
    devices = ("cpu", "cuda")
    dtypes_by_device = {"cpu": DTYPES, "cuda": ("float32", "float16", "bfloat16")}
    capabilities = FLEX_CAPS
    cpu_lacks = frozenset({"grads", "dbias"})   # eager flex on CPU has no backward

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self.dtypes = self.dtypes_by_device[device]
        if device == "cpu":
            self.capabilities = FLEX_CAPS - self.cpu_lacks

    def kernel_description(self) -> str:
        if self.device == "cpu":
            return "flex_attention, eager (unfused reference implementation; CPU has no compiled LSE/backward)"
        return "torch.compile(flex_attention) (fused Triton kernel)"

    def extra_support(self, case: Case):
        if case.layout == "broadcast_kv" and not _equal_over_batch(case):
            return "layout broadcast_kv needs K and V equal across the batch"
        if self.device == "cuda" and min(case.shape["Dk"], case.shape["Dv"]) < CUDA_MIN_HEAD_DIM:
            # inductor's lowering raises "NYI: embedding dimension of the query, key, and value must be
            # at least 16" (torch 2.11 on an H100): a documented limit, not a wrong answer
            return f"{self.name} on CUDA needs head dims of at least {CUDA_MIN_HEAD_DIM}"
        return True

    def mods(self, case: Case, grads: bool):
        """(score_mod, block_mask, bias leaf) for the case."""
        s, dev = case.shape, self.device
        B, Hq, Lq, Lk = s["B"], s["Hq"], s["Lq"], s["Lk"]
        full = (B, Hq, Lq, Lk)
        conds = []
        if case.mask is not None:
            m = to_tensor(np.broadcast_to(case.mask, full), "bool", dev)
            conds.append(lambda b, h, i, j: m[b, h, i, j])
        ql = to_tensor(case.q_lengths if case.q_lengths is not None else np.full(B, Lq), "float64", dev).long()
        kl = to_tensor(case.kv_lengths if case.kv_lengths is not None else np.full(B, Lk), "float64", dev).long()
        if case.causal == "top_left":
            conds.append(lambda b, h, i, j: j <= i)
        elif case.causal == "bottom_right":
            conds.append(lambda b, h, i, j: j <= i + (kl[b] - ql[b]))
        if case.kv_lengths is not None:
            conds.append(lambda b, h, i, j: j < kl[b])
        if case.q_lengths is not None:
            conds.append(lambda b, h, i, j: i < ql[b])
        block_mask = None
        if conds:
            def mask_mod(b, h, i, j):
                ok = conds[0](b, h, i, j)
                for c in conds[1:]:
                    ok = ok & c(b, h, i, j)
                return ok
            block_mask = create_block_mask(mask_mod, B, Hq, Lq, Lk, device=dev)
        if case.bias is None:
            return None, block_mask, None
        bias_t = to_tensor(case.bias, case.dtype, dev).requires_grad_(grads)
        bias_e = bias_t.expand(full)

        def add_bias(score, b, h, i, j):
            return score + bias_e[b, h, i, j]
        return add_bias, block_mask, bias_t

    def run(self, case: Case, *, grads: bool = False) -> Result:
        dev, t = self.device, case.dtype
        q, k, v = (_input(x, t, dev, grads=grads, layout=case.layout, kv=name != "q")
                   for name, x in (("q", case.q), ("k", case.k), ("v", case.v)))
        s = case.shape
        fn = flex_attention if dev == "cpu" else _compiled_flex()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                score_mod, block_mask, bias_t = self.mods(case, grads)
                lse_arg = {"return_aux": AuxRequest(lse=True)} if AuxRequest is not None else {"return_lse": True}
                # a Python float, as callers pass it: compiled flex fails to compile with a NumPy float64
                # scale (torch 2.11 CUDA, 2.13 CPU; adapters/torch/findings/TORCH-FLEX-COMPILE-NUMPY-SCALE.py)
                scale = None if case.scale is None else float(case.scale)
                out, aux = fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=s["Hkv"] != s["Hq"], **lse_arg)
                lse = aux.lse if AuxRequest is not None else aux
            except Exception as exc:
                raise KernelError(f"flex_attention raised {type(exc).__name__}: {_clean(str(exc))}") from exc
        res = Result(out=to_numpy(out), out_dtype=dtype_name(out), lse=to_numpy(lse),
                     kernel=self.kernel_description())
        if grads:
            leaves = {"dq": q, "dk": k, "dv": v}
            if bias_t is not None:
                leaves["dbias"] = bias_t
            go = to_tensor(case.grad_out, t, dev)
            try:
                gs = torch.autograd.grad(out, list(leaves.values()), go, allow_unused=True)
            except Exception as exc:
                raise KernelError(f"flex backward raised {type(exc).__name__}: {_clean(str(exc))}") from exc
            res.grads = {n: to_numpy(g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(leaves, gs)}
        return res

    def run_raw(self, q, k, v, dtype):
        args = [to_tensor(x, dtype, self.device) for x in (q, k, v)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return to_numpy(flex_attention(*args))
