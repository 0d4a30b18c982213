"""The `sageattn` convention: SageAttention's `sageattn`.

    sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs)

(thu-ml/SageAttention `sageattention/core.py`; `smooth_k` is a named parameter in 1.0.x and is
read from **kwargs by the later Triton entry `sageattn_qk_int8_pv_fp16_triton`). Every argument
is bound by keyword. What the convention says, and how a Case maps onto it:

- `tensor_layout="HND"`: q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D), the Case's own layout, passed
  contiguous; layout "noncontiguous" passes `tensor_layout="NHD"` with the (B, L, H, D) transposed
  views (last dimension contiguous, as upstream asserts); the output comes back in the same layout;
- GQA by contiguous head groups ("num_qo_heads must be divisible by num_kv_heads", the kernel reads
  KV head h // (Hq / Hkv)); `sm_scale` None = 1 / sqrt(head_dim);
- `is_causal=True` is "only applicable when qo_len == kv_len": causal cases with Lq != Lk are outside;
- float16 and bfloat16 only (the current docstring; 1.0.x also took float32), the output in the
  input dtype, head dims up to 128 (1.0.x: exactly 64, 96 or 128; declare `head_dims` for it);
- no lse in this convention (1.0.x returns none; `return_lse` came later), no mask, no gradients.

With no other declaration the kernel is held to the upstream scheme of SageAttention's Triton path
(`CONTRACT`): int8 per block of 128 queries and 64 keys (Q pre-multiplied by sm_scale * log2 e),
smooth-K, P and V in float16 (conformance/engine/alternatives_contracts.py, SPEC section 29). A kernel
declaring `quantization = {..., smooth_k = false}` is called with `smooth_k=False`.
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case
from attnconf.spec.vocabulary import HALF_DTYPES

from ..base import Result
from .common import Convention, ConventionAdapter

KEYWORDS = ("q", "k", "v", "tensor_layout", "is_causal", "sm_scale", "smooth_k")
FEATURES = frozenset({"causal_bottom_right", "gqa", "custom_scale", "cross", "noncontiguous"})
OUTSIDE = ("boolean masks", "additive bias", "query/key padding", "causal with Lq != Lk", "Dv != Dk",
           "sliding windows, softcap, ALiBi, sinks", "the lse", "gradients", "float32 and float64")
CONTRACT = {"quantization": {"scheme": "int8_per_block", "q_block": 128, "k_block": 64, "smooth_k": True,
                             "pv": "float16"}, "default": True}


class SageAttn(Convention):
    def expressible(self, case: Case):
        s = case.shape
        if case.causal is not None and s["Lq"] != s["Lk"]:
            return "is_causal with qo_len != kv_len (upstream: only applicable when qo_len == kv_len)"
        return True

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        s = case.shape
        nhd = case.layout == "noncontiguous"
        q, k, v = (ad.tensor(x, case.dtype) for x in (case.q, case.k, case.v))
        if nhd:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        contract = getattr(ad, "accuracy_contract", None) or {}
        smooth = bool(contract.get("quantization", {}).get("smooth_k", True))
        kwargs = dict(q=q, k=k, v=v, tensor_layout="NHD" if nhd else "HND", is_causal=case.causal is not None,
                      sm_scale=None if case.scale is None else float(case.scale), smooth_k=smooth)
        ret = ad.invoke(kwargs, None)
        out_t, _ = ad.unpack(ret, False, "return_lse")
        shape = (s["B"], s["Lq"], s["Hq"], s["Dv"]) if nhd else (s["B"], s["Hq"], s["Lq"], s["Dv"])
        out = ad.array(out_t, shape, "output")
        if nhd:
            out = out.transpose(0, 2, 1, 3)
        return Result(out=np.ascontiguousarray(out), out_dtype=ad.out_dtype(out_t), kernel=ad.name)

    def run_raw(self, ad, q, k, v, dtype):
        t = [ad.tensor(x, dtype if dtype in self.dtypes else "float16") for x in (q, k, v)]
        ret = ad.fn(q=t[0], k=t[1], v=t[2])
        return ret.detach().cpu().float().numpy()


CONVENTION = SageAttn(
    name="sageattn", entry="sageattention.sageattn", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES, outside=OUTSIDE, dtypes=HALF_DTYPES, max_head_dim=128, accuracy_contract=CONTRACT)
