"""torch `F.scaled_dot_product_attention`, one adapter per forced backend.

Torch silently falls back from a fused path to MATH unless one backend is forced
with `sdpa_kernel([ONE])`; a test passing on a fallback would certify the wrong
kernel. So each adapter forces exactly one backend, asks torch beforehand
(`torch._fused_sdp_choice`, which runs nothing) whether that backend accepts
the very tensors of the case, and turns a refusal into an unsupported reason.
A dispatch-mode recorder notes which aten kernel actually ran.
"""
from __future__ import annotations

import re
import warnings
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from attnconf.reference import Case
from attnconf.spec.vocabulary import DTYPES, HALF_DTYPES

from attnconf.adapters.base import Adapter, KernelError, NotSupported, Result
from attnconf.adapters.sdpa_convention import fold_mask
from attnconf.adapters.torch.convert import dtype_name, device_info, to_numpy, to_tensor

SDPA_CAPS = frozenset({"mask", "bias", "causal_top_left", "causal_bottom_right", "q_lengths", "kv_lengths",
                       "gqa", "custom_scale", "dv_ne_dk", "cross", "mask_with_causal", "grads",
                       "dropout", "noncontiguous", "broadcast_kv"})
NO_KERNEL = re.compile(r"No available kernel|No viable backend")


class ForcedPathUnavailable(NotSupported):
    """The forced SDPA backend refused the case at run time: recorded UNSUPPORTED, never a pass or a failure."""


class _KernelRecorder(TorchDispatchMode):
    """Records the names of the attention ops that reach the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "attention" in name or "softmax" in name:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


class TorchAdapter(Adapter):
    """What every torch adapter shares: the backend name and `describe()`."""

    backend = "torch"
    kind = "sdpa"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **device_info(self.device), "kernel": self.kernel_description()}

    def kernel_description(self) -> str:
        return self.name


class SdpaAdapter(TorchAdapter):
    """`F.scaled_dot_product_attention` with one backend forced; subclasses set the class data."""

    sdp_backend: ClassVar[SDPBackend]
    fused_op: ClassVar[str] = ""                       # substring of the aten op that must run
    dtypes_by_device: ClassVar[dict[str, tuple[str, ...]]] = {"cpu": DTYPES, "cuda": DTYPES}
    capabilities = SDPA_CAPS | {"dbias"}
    # what the forced backend refuses on a device, every time (torch._fused_sdp_choice's reasons)
    lacks_by_device: ClassVar[dict[str, frozenset[str]]] = {}

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self.dtypes = self.dtypes_by_device[device]
        self.capabilities = self.capabilities - self.lacks_by_device.get(device, frozenset())

    def kernel_description(self) -> str:
        return f"F.scaled_dot_product_attention forced to SDPBackend.{self.sdp_backend.name}"

    # -- support -------------------------------------------------------------
    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        ok = super().supports(case, need=need)
        if ok is not True:
            return ok
        return self.probe(case, grads="grads" in need)

    def extra_support(self, case: Case) -> Literal[True] | str:
        if case.layout == "broadcast_kv" and not _equal_over_batch(case):
            return "layout broadcast_kv needs K and V equal across the batch"
        return True

    def probe(self, case: Case, *, grads: bool = False) -> Literal[True] | str:
        """Ask torch whether the forced backend accepts this case's tensors (nothing is computed)."""
        args, kwargs, _ = self.arguments(case, grads=grads)
        with sdpa_kernel([self.sdp_backend]), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                torch._fused_sdp_choice(*args, **kwargs)
            except RuntimeError as exc:
                why = "; ".join(m for m in (_clean(str(w.message)) for w in caught) if m) or _clean(str(exc))
                return f"{self.name} (forced SDPBackend.{self.sdp_backend.name}) refuses this case: {why}"
        return True

    # -- running -------------------------------------------------------------
    def arguments(self, case: Case, *, grads: bool = False) -> tuple[tuple, dict, dict[str, torch.Tensor]]:
        """(args, kwargs, leaves): the SDPA call for `case`; leaves are the tensors to differentiate."""
        dev, t = self.device, case.dtype
        q, k, v = (_input(x, t, dev, grads=grads, layout=case.layout, kv=name != "q")
                   for name, x in (("q", case.q), ("k", case.k), ("v", case.v)))
        leaves = {"dq": q, "dk": k, "dv": v}   # gradients are taken w.r.t. the very views passed in
        attn_mask, is_causal = fold_mask(case)
        mask_t = None
        if attn_mask is not None and attn_mask.dtype == bool:
            mask_t = to_tensor(attn_mask, "bool", dev)
        elif attn_mask is not None:
            bias_t = to_tensor(case.bias, t, dev)
            if grads and "dbias" in self.capabilities:
                bias_t.requires_grad_(True)
                leaves["dbias"] = bias_t
            if attn_mask is case.bias:
                mask_t = bias_t
            else:  # bias folded with causal/padding/mask: -inf where invisible, built in torch so dbias flows
                keep = to_tensor(~np.isneginf(attn_mask), "bool", dev)
                mask_t = torch.where(keep, bias_t.expand(attn_mask.shape), torch.tensor(-np.inf, dtype=bias_t.dtype, device=dev))
        s = case.shape
        kwargs = dict(attn_mask=mask_t, dropout_p=case.dropout_p, is_causal=is_causal,
                      scale=case.scale, enable_gqa=s["Hkv"] != s["Hq"])
        return (q, k, v), kwargs, leaves

    def run(self, case: Case, *, grads: bool = False) -> Result:
        args, kwargs, leaves = self.arguments(case, grads=grads)
        if case.dropout_p:
            torch.manual_seed(case.seed)
        rec = _KernelRecorder()
        with sdpa_kernel([self.sdp_backend]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with rec:
                    out = F.scaled_dot_product_attention(*args, **kwargs)
            except RuntimeError as exc:
                msg = _clean(str(exc))
                if NO_KERNEL.search(msg):
                    raise ForcedPathUnavailable(f"forced SDPBackend.{self.sdp_backend.name} has no kernel for this case") from exc
                raise KernelError(f"torch raised RuntimeError: {msg}") from exc
            kernel = self.check_kernel(rec.ops)
            res = Result(out=to_numpy(out), out_dtype=dtype_name(out), kernel=kernel)
            if grads:
                res.grads = self.backward(out, case, leaves)
        return res

    def check_kernel(self, ops: list[str]) -> str:
        fused = [o for o in ops if "_scaled_dot_product_" in o and "math" not in o]
        if self.fused_op:
            if not any(self.fused_op in o for o in fused):
                raise KernelError(f"{self.name}: expected an op containing {self.fused_op!r}, saw {ops}")
            return fused[0]
        if fused:
            raise KernelError(f"{self.name}: MATH was forced but a fused kernel ran: {fused}")
        return "MATH: " + (", ".join(dict.fromkeys(ops)) or "decomposed aten ops")

    @staticmethod
    def backward(out: torch.Tensor, case: Case, leaves: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        if case.grad_out is None:
            raise ValueError("grads=True needs case.grad_out")
        names = list(leaves)
        go = to_tensor(case.grad_out, case.dtype, str(out.device))
        try:
            gs = torch.autograd.grad(out, [leaves[n] for n in names], go, allow_unused=True)
        except RuntimeError as exc:
            msg = _clean(str(exc))
            if NO_KERNEL.search(msg):
                raise ForcedPathUnavailable(f"backward has no kernel: {msg}") from exc
            raise KernelError(f"backward raised RuntimeError: {msg}") from exc
        grads = {}
        for n, g in zip(names, gs):
            if g is None:
                raise KernelError(f"backward returned no gradient for {n}")
            grads[n] = to_numpy(g)
        return grads

    def run_raw(self, q, k, v, dtype):
        args = [to_tensor(x, dtype, self.device) for x in (q, k, v)]
        with sdpa_kernel([self.sdp_backend]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return to_numpy(F.scaled_dot_product_attention(*args))


def _input(x: np.ndarray, dtype: str, device: str, *, grads: bool, layout: str, kv: bool) -> torch.Tensor:
    """One of q, k, v in the case's layout (same values; only strides differ)."""
    if layout == "broadcast_kv" and kv:  # stride 0 over the batch, from a batch-1 tensor
        base = to_tensor(x[:1], dtype, device).requires_grad_(grads)
        return base.expand(x.shape[0], -1, -1, -1)
    t = to_tensor(x, dtype, device).requires_grad_(grads)
    if layout == "noncontiguous":  # the (B, L, H, D) projection layout seen as (B, H, L, D)
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


def _equal_over_batch(case: Case) -> bool:
    return all(np.array_equal(x, np.broadcast_to(x[:1], x.shape), equal_nan=True) for x in (case.k, case.v))


def _clean(msg: str) -> str:
    """First meaningful line of a torch warning/error, without the C++ source location."""
    msg = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", msg).strip()
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip() and not ln.strip().endswith("because:")]
    return " ".join(lines)[:300]


class SdpaMath(SdpaAdapter):
    name = "torch:sdpa-math"
    sdp_backend = SDPBackend.MATH
    devices = ("cpu", "cuda")


class SdpaFlash(SdpaAdapter):
    name = "torch:sdpa-flash"
    sdp_backend = SDPBackend.FLASH_ATTENTION
    fused_op = "_scaled_dot_product_flash_attention"
    devices = ("cpu", "cuda")
    dtypes_by_device = {"cpu": DTYPES, "cuda": HALF_DTYPES}
    capabilities = SDPA_CAPS            # no dbias: the flash kernels take no attn_mask gradient
    lacks_by_device = {
        # the CPU flash kernel takes no dropout: torch._fused_sdp_choice refuses every case with
        # dropout_p > 0 (torch 2.13), so its dropout cells are out of scope at once instead of after
        # hundreds of refused draws
        "cpu": frozenset({"dropout"}),
        # the CUDA flash kernel takes no attn_mask ("Flash Attention does not support non-null attn_mask",
        # torch 2.11 on an H100), and the adapter passes padding and bottom-right causal as one; its only
        # causal masking is is_causal=True, top-left
        "cuda": frozenset({"mask", "bias", "q_lengths", "kv_lengths", "mask_with_causal", "causal_bottom_right"}),
    }


class SdpaEfficient(SdpaAdapter):
    name = "torch:sdpa-efficient"
    sdp_backend = SDPBackend.EFFICIENT_ATTENTION
    fused_op = "_scaled_dot_product_efficient_attention"
    devices = ("cuda",)
    dtypes_by_device = {"cuda": ("float32", "float16", "bfloat16")}
    # "For dense input, both fused kernels require query, key and value to have the same num_heads"
    # (torch 2.11 on an H100): enable_gqa is refused; grouped heads reach it only expanded by the caller
    lacks_by_device = {"cuda": frozenset({"gqa"})}


class SdpaCudnn(SdpaAdapter):
    name = "torch:sdpa-cudnn"
    sdp_backend = SDPBackend.CUDNN_ATTENTION
    fused_op = "_scaled_dot_product_cudnn_attention"
    devices = ("cuda",)
    dtypes_by_device = {"cuda": HALF_DTYPES}
    capabilities = SDPA_CAPS


SDPA_ADAPTERS: tuple[type[SdpaAdapter], ...] = (SdpaMath, SdpaFlash, SdpaEfficient, SdpaCudnn)
