"""The `torch` backend: SDPA with each backend forced, flex_attention, nn.MultiheadAttention.

Every implementation is its own adapter so a result always names the kernel
that produced it: `torch:sdpa-math`, `torch:sdpa-flash` (CPU and CUDA),
`torch:sdpa-efficient` and `torch:sdpa-cudnn` (CUDA only), `torch:flex`, and the
layer adapter `torch:mha`. float32 matmuls run at full precision (TF32 off)
unless the run asks for `--allow-tf32`; the flags are recorded in `describe()`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from attnconf.reference import Case

from attnconf.adapters.base import Adapter, Implementation, KernelError, NotSupported, Result
from attnconf.adapters.callable import FULL_SDPA, CallableAdapter
from attnconf.adapters.contract import is_refusal
from attnconf.adapters.torch.convert import device_info, dtype_name, limit_threads, set_precision, to_numpy, to_tensor
from attnconf.adapters.torch.flex import FlexAdapter
from attnconf.adapters.torch.layer import MhaAdapter
from attnconf.adapters.torch.sdpa import SDPA_ADAPTERS, ForcedPathUnavailable, SdpaAdapter, _clean, _input

IMPLEMENTATIONS: tuple[type[Implementation], ...] = (*SDPA_ADAPTERS, FlexAdapter, MhaAdapter)


def implementations(device: str, options: dict[str, Any]) -> list[Implementation]:
    if device == "cuda" and not torch.cuda.is_available():
        from attnconf.adapters import UsageError  # noqa: PLC0415 (the package is initialised by then)

        raise UsageError(f"--device=cuda but torch {torch.__version__} sees no CUDA device")
    set_precision(options)
    return [cls(device) for cls in IMPLEMENTATIONS if device in cls.devices]


class TorchKernelAdapter(CallableAdapter):
    """A third-party torch kernel with the SDPA convention; gradients through autograd.

    Q, K and V come in the case's layout, as torch's own SDPA takes them: contiguous, the
    (B, L, H, D) projection layout seen as (B, H, L, D) (`noncontiguous`), or K/V expanded from
    batch 1 with stride 0 (`broadcast_kv`); a kernel that reads its inputs as contiguous memory
    fails there. Gradients are taken with respect to the very tensors passed in."""

    def __init__(self, fn: Callable[..., Any], device: str, name: str):
        super().__init__(fn, backend="torch", name=name, device=device,
                         to_array=lambda x, dtype: to_tensor(x, dtype, device), to_numpy=to_numpy,
                         dtype_name=dtype_name, capabilities=FULL_SDPA | {"grads", "noncontiguous", "broadcast_kv"})

    def inputs(self, case: Case, *, grads: bool = False) -> tuple:
        return tuple(_input(x, case.dtype, self.device, grads=grads, layout=case.layout, kv=n != "q")
                     for n, x in (("q", case.q), ("k", case.k), ("v", case.v)))

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if case.dropout_p:
            torch.manual_seed(case.seed)
        args, kwargs = self.arguments(case, grads=grads)
        ret = self.call(args, kwargs)
        out, dtype = self.convert(ret)
        res = Result(out=out, out_dtype=dtype, kernel=self.name)
        if grads:
            if case.grad_out is None:
                raise ValueError("grads=True needs case.grad_out")
            try:
                gs = torch.autograd.grad(ret, list(args), to_tensor(case.grad_out, case.dtype, self.device),
                                         allow_unused=True)
            except Exception as exc:
                if is_refusal(self, exc):
                    raise NotSupported(f"{self.name} backward raised {type(exc).__name__}: {_clean(str(exc))}") from None
                raise KernelError(f"kernel backward raised {type(exc).__name__}: {_clean(str(exc))}") from exc
            if any(g is None for g in gs):
                raise KernelError("kernel backward returned no gradient for some input")
            res.grads = {n: to_numpy(g) for n, g in zip(("dq", "dk", "dv"), gs)}
        return res

    def describe(self) -> dict[str, Any]:
        return {**device_info(self.device), **super().describe()}


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    limit_threads()
    return TorchKernelAdapter(fn, device, name)


__all__ = ["ForcedPathUnavailable", "IMPLEMENTATIONS", "SdpaAdapter",
           "TorchKernelAdapter", "implementations", "kernel_adapter"]
