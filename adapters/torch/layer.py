"""torch `nn.MultiheadAttention` as a layer adapter (ATTN-MHA-1).

The LayerCase's weights are applied as y = x W + b; torch's projections compute
y = x W_t^T + b, so W_t = W^T, and q, k, v share one packed `in_proj_weight`.
Torch's boolean `attn_mask` means True = BLOCKED, the inverse of SDPA's and of
the LayerCase's: the mask is inverted here, and top-left causal is folded into
it (MHA's `is_causal` is only a hint that requires the mask anyway).
"""
from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np
import torch

from attnconf.spec.vocabulary import DTYPES

from attnconf.adapters.base import KernelError, LayerAdapter
from attnconf.adapters.torch.convert import device_info, to_numpy, to_tensor
from attnconf.adapters.torch.sdpa import _clean


class MhaAdapter(LayerAdapter):
    backend = "torch"
    name = "torch:mha"
    devices = ("cpu", "cuda")
    dtypes = DTYPES
    # mask and top-left causal are folded into one blocked mask, so they combine
    capabilities = frozenset({"mask", "causal_top_left", "cross", "mask_with_causal"})

    def kernel_description(self) -> str:
        return "nn.MultiheadAttention(batch_first=True, need_weights=False), eval mode"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **device_info(self.device), "kernel": self.kernel_description()}

    def extra_layer_support(self, lc: Any) -> Literal[True] | str:
        if lc.x_k.shape[-1] != lc.x_q.shape[-1] or lc.x_v.shape[-1] != lc.x_q.shape[-1]:
            return f"{self.name}: this adapter loads only kdim = vdim = E"
        return True

    def module(self, lc: Any) -> torch.nn.MultiheadAttention:
        E = lc.x_q.shape[-1]
        has_bias = any(b is not None for b in (lc.b_q, lc.b_k, lc.b_v, lc.b_o))
        dt = lc.dtype
        mha = torch.nn.MultiheadAttention(E, lc.num_heads, bias=has_bias, batch_first=True, dropout=0.0)
        mha = mha.to(device=self.device, dtype=to_tensor(np.zeros(1), dt).dtype).eval()
        zero = np.zeros(E)
        with torch.no_grad():
            mha.in_proj_weight.copy_(to_tensor(np.concatenate([lc.w_q.T, lc.w_k.T, lc.w_v.T]), dt, self.device))
            mha.out_proj.weight.copy_(to_tensor(lc.w_o.T, dt, self.device))
            if has_bias:
                bq, bk, bv, bo = (zero if b is None else b for b in (lc.b_q, lc.b_k, lc.b_v, lc.b_o))
                mha.in_proj_bias.copy_(to_tensor(np.concatenate([bq, bk, bv]), dt, self.device))
                mha.out_proj.bias.copy_(to_tensor(bo, dt, self.device))
        return mha

    def blocked_mask(self, lc: Any) -> torch.Tensor | None:
        """torch's attn_mask: (B * num_heads, Lq, Lk) bool, True = BLOCKED."""
        B, Lq, Lk = lc.x_q.shape[0], lc.x_q.shape[1], lc.x_k.shape[1]
        visible = np.ones((B, Lq, Lk), dtype=bool)
        if lc.mask is not None:
            visible &= np.broadcast_to(lc.mask, (B, Lq, Lk))
        if lc.causal == "top_left":
            visible &= np.tril(np.ones((Lq, Lk), dtype=bool))
        if lc.mask is None and lc.causal is None:
            return None
        blocked = np.repeat(~visible, lc.num_heads, axis=0)   # torch orders the 3-D mask batch-major
        return to_tensor(blocked, "bool", self.device)

    def run_layer(self, lc: Any) -> np.ndarray:
        mha = self.module(lc)
        xq, xk, xv = (to_tensor(x, lc.dtype, self.device) for x in (lc.x_q, lc.x_k, lc.x_v))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out, _ = mha(xq, xk, xv, attn_mask=self.blocked_mask(lc), need_weights=False)
            except Exception as exc:
                raise KernelError(f"nn.MultiheadAttention raised {type(exc).__name__}: {_clean(str(exc))}") from exc
        return to_numpy(out)
