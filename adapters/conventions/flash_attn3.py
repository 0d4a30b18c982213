"""The `flash_attn3` convention: flash-attention 3's hopper interface `flash_attn_func`.

    flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False)

(Dao-AILab/flash-attention `hopper/flash_attn_interface.py`, `hopper/flash_api.cpp`,
`hopper/mask.h`, `hopper/softmax.h`). Every argument is bound by keyword. What differs from the
`flash_attn` convention (flash_attn.py, whose layout, GQA grouping, bottom-right causal and window
bounds and softcap this one shares):

- no dropout and no ALiBi; `qv` (MLA's extra query) is None, `num_splits=1`, `pack_gqa=None`,
  `sm_margin=0` (scheduling knobs that must not change the result);
- `return_attn_probs=True` returns the tuple (out, softmax_lse), False the output alone (since
  Dao-AILab/flash-attention#1851, 2025-08-29; before it the hopper interface always returned
  (out, softmax_lse), which the adapter accepts too, taking the output from it); the lse is
  (B, Hq, Lq), natural log, float32, and a row that sees no key has lse = -inf (`softmax.h`: a zero
  row sum gives -INFINITY), unlike flash-attention 2's +inf;
- `attention_chunk=C` > 0 is chunked local attention (Llama 4): the keys are cut into chunks of C
  positions counted from key 0, and query i sees only the keys of the chunk holding its bottom-right
  position p = i + Lk - Lq, `[floor(p / C) C, floor(p / C) C + C - 1]` (`mask.h`: round_down of
  row_idx + seqlen_k - seqlen_q); combined with `causal` and `window_size` it is their intersection
  (`flash_api.cpp` clips both window sides to C - 1 and causal sets the right side to 0): with causal,
  `[floor(p / C) C, p]`. The Case's `chunk` (ATTN-CHUNK-1). The backward does not support it upstream
  ("FA3 backward does not support attention_chunk"): gradients of chunked cases are unsupported;
- `q_descale`, `k_descale`, `v_descale`: float32 (B, Hkv) factors, "(b, h_k), not (b, h)", for FP8
  e4m3 inputs: the kernel attends over x_fp8 * descale[b, kv head of the head]. They are passed only to
  a kernel that declares `quantization = {scheme = "fp8_e4m3_per_head"}`; the convention then
  quantizes Q, K and V itself (reference/quantize.py, the same function the reference uses), a query
  head using the factor of its KV head, and the output is bfloat16 (flash-attention's FP8 output
  dtype), so such a kernel declares `dtypes = ["bfloat16"]`. Causal cases are outside this path: the
  factors are the amax over every key, so quantizing a causal case would read keys its rows cannot see.

Outside the convention: masks, bias, padding, dropout, ALiBi, sinks, `qv`, top-left causal, window
or chunk with Lq != Lk.
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case
from attnconf.spec.vocabulary import HALF_DTYPES

from ..base import NotSupported, Result
from .common import Convention, ConventionAdapter, lse_to_spec
from .flash_attn import bhld_to_blhd

KEYWORDS = ("q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale", "window_size",
            "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic", "sm_margin", "return_attn_probs")
FEATURES = frozenset({"causal_bottom_right", "window_bottom_right", "chunk_bottom_right", "softcap", "gqa",
                      "custom_scale", "cross", "dv_ne_dk", "lse", "grads", "noncontiguous", "broadcast_kv"})
OUTSIDE = ("boolean masks", "additive bias", "query/key padding", "dropout", "ALiBi", "attention sinks", "qv",
           "top-left causal, window or chunk with Lq != Lk")


def fp8_scheme(ad: ConventionAdapter) -> bool:
    contract = getattr(ad, "accuracy_contract", None) or {}
    return contract.get("quantization", {}).get("scheme") == "fp8_e4m3_per_head"


def fp8_arguments(ad: ConventionAdapter, case: Case) -> dict[str, torch.Tensor]:
    """q, k, v as float8_e4m3fn (B, L, H, D) and their (B, Hkv) float32 descale factors."""
    from attnconf.reference.quantize import fp8_inputs

    out = {}
    for name, (vals, descale) in fp8_inputs(case).items():
        t = torch.tensor(vals, dtype=torch.float32, device=ad.device).to(torch.float8_e4m3fn)
        out[name] = t.transpose(1, 2).contiguous()
        out[f"{name}_descale"] = torch.tensor(descale, dtype=torch.float32, device=ad.device)
    return out


class FlashAttn3(Convention):
    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        s = case.shape
        B, Hq, Lq, Dv = s["B"], s["Hq"], s["Lq"], s["Dv"]
        if grads and case.chunk is not None:
            raise NotSupported("flash_attn3: the backward does not support attention_chunk (upstream)")
        fp8 = fp8_scheme(ad)
        if fp8 and (grads or case.dtype != "bfloat16"):
            raise NotSupported("flash_attn3 FP8: forward only, bfloat16 output")
        if fp8 and case.causal is not None:
            raise NotSupported("flash_attn3 FP8: the convention's per-(batch, KV head) descale factors are the amax over "
                               "every key, which a causal row may not see (static scales would be causal; SPEC section 29)")
        leaves: dict[str, torch.Tensor] = {}
        if fp8:
            tensors = fp8_arguments(ad, case)
        else:
            tensors = {n: bhld_to_blhd(ad, getattr(case, n), case, grads=grads, kv=n != "q", leaves=leaves,
                                       name=f"d{n}") for n in ("q", "k", "v")}
            tensors.update(q_descale=None, k_descale=None, v_descale=None)
        kwargs = dict(**tensors, softmax_scale=None if case.scale is None else float(case.scale),
                      causal=case.causal is not None, qv=None,
                      window_size=tuple(int(w) for w in case.window) if case.window is not None else (-1, -1),
                      attention_chunk=int(case.chunk or 0), softcap=0.0 if case.softcap is None else float(case.softcap),
                      num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False)
        ret = ad.invoke(kwargs, None)
        if isinstance(ret, (tuple, list)) and len(ret) == 2:     # the interface before 2025-08-29 (see above)
            ret = ret[0]
        out_t, _ = ad.unpack(ret, False, "return_attn_probs")
        out = ad.array(out_t, (B, Lq, Hq, Dv), "output").transpose(0, 2, 1, 3)
        res = Result(out=np.ascontiguousarray(out), out_dtype=ad.out_dtype(out_t), kernel=ad.name)
        if grads:
            go = ad.tensor(case.grad_out, case.dtype).transpose(1, 2)
            res.grads = ad.backward(out_t, leaves, go)
        if want_lse:
            with torch.no_grad():
                ret = ad.invoke({**kwargs, "return_attn_probs": True}, None)
            out2_t, lse_t = ad.unpack(ret, True, "return_attn_probs")
            res.out_with_lse = ad.array(out2_t, (B, Lq, Hq, Dv), "output (return_attn_probs=True)").transpose(0, 2, 1, 3)
            lse = ad.array(lse_t, (B, Hq, Lq), "lse (B, H, Lq)")
            res.lse = lse_to_spec(lse, case, empty=-np.inf, base2=False, name=self.name,
                                  where=lambda i: f"batch {i[0]}, head {i[1]}, query {i[2]}")
        return res

    def run_raw(self, ad, q, k, v, dtype):
        t = [ad.tensor(x, dtype).transpose(1, 2).contiguous() for x in (q, k, v)]
        ret = ad.fn(q=t[0], k=t[1], v=t[2])
        return (ret[0] if isinstance(ret, (tuple, list)) else ret).detach().cpu().float().numpy()


CONVENTION = FlashAttn3(
    name="flash_attn3", entry="flash_attn_interface.flash_attn_func (hopper)", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE, dtypes=HALF_DTYPES, max_head_dim=256)
