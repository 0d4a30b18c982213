"""OpenVINO's ScaledDotProductAttention-13 operator on the CPU plugin, in the torch SDPA convention.

The operator "partially implements torch.nn.functional.scaled_dot_product_attention, omitting
training-related parameter": query [N, ..., L, E], key [N, ..., S, E], value [N, ..., S, Ev],
an optional bool (True = take part) or float attention_mask, an optional scale and a `causal`
attribute (top-left, `triu(-inf, k=1)`, like torch's is_causal). Each call builds a one-node model
and compiles it for the CPU plugin (cached per signature); the scale is a scalar input of the
query's type, as the specification has it. The inference precision hint is left at the plugin's
default, which is what a user gets.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import torch

from reports.real._bridge import to_numpy, to_torch

_OV = {torch.float32: ov.Type.f32, torch.float16: ov.Type.f16, torch.bfloat16: ov.Type.bf16}
_CORE = ov.Core()


@lru_cache(maxsize=64)
def _compiled(et: ov.Type, shapes: tuple, mask_kind: str | None, has_scale: bool, causal: bool):
    q, k, v = (ops.parameter(list(s), et) for s in shapes[:3])
    params = [q, k, v]
    mask = None
    if mask_kind is not None:
        mask = ops.parameter(list(shapes[3]), ov.Type.boolean if mask_kind == "bool" else et)
        params.append(mask)
    scale = None
    if has_scale:
        scale = ops.parameter([], et)
        params.append(scale)
        if mask is None:
            mask = ops.constant(np.zeros((), np.float32)).output(0)
            mask = ops.convert_like(mask, q)
    node = ops.scaled_dot_product_attention(q, k, v, mask, scale, causal=causal)
    return _CORE.compile_model(ov.Model([node], params), "CPU")


def _ov_input(t: torch.Tensor) -> ov.Tensor:
    if t.dtype == torch.bfloat16:
        # NumPy has no bfloat16: hand OpenVINO the raw 16-bit patterns as a bf16 tensor.
        bits = t.detach().contiguous().view(torch.int16).numpy()
        out = ov.Tensor(ov.Type.bf16, list(bits.shape))
        out.data.view(np.int16)[...] = bits
        return out
    return ov.Tensor(to_numpy(t))


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise NotImplementedError("ScaledDotProductAttention-13 omits dropout (training-related)")
    if query.dtype not in _OV:
        raise NotImplementedError(f"no OpenVINO CPU element type used for {query.dtype}")
    et = _OV[query.dtype]
    if attn_mask is not None and attn_mask.dim() < 2:
        # torch broadcasts a mask of any rank; the operator takes "[N, ..., L, S]": the same values
        # with leading unit axes.
        attn_mask = attn_mask.reshape((1,) * (2 - attn_mask.dim()) + tuple(attn_mask.shape))
    mask_kind = None if attn_mask is None or is_causal else ("bool" if attn_mask.dtype == torch.bool else "float")
    shapes = (tuple(query.shape), tuple(key.shape), tuple(value.shape),
              tuple(attn_mask.shape) if mask_kind else None)
    model = _compiled(et, shapes, mask_kind, scale is not None, bool(is_causal))
    inputs = [_ov_input(t) for t in (query, key, value)]
    if mask_kind == "bool":
        inputs.append(ov.Tensor(to_numpy(attn_mask)))
    elif mask_kind == "float":
        inputs.append(_ov_input(attn_mask.to(query.dtype)))
    if scale is not None:
        inputs.append(_ov_input(torch.tensor(float(scale), dtype=query.dtype)))
    result = model.create_infer_request().infer(inputs, share_inputs=False)
    out = result[model.output(0)]
    out_type = model.output(0).get_element_type()
    back = {ov.Type.f32: torch.float32, ov.Type.f16: torch.float16, ov.Type.bf16: torch.bfloat16}[out_type]
    if out_type == ov.Type.bf16:
        return torch.from_numpy(np.ascontiguousarray(out).view(np.int16).copy()).view(torch.bfloat16)
    return to_torch(np.asarray(out), back)
