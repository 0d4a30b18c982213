"""The `flashinfer_batch_decode` convention: FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` (forward only).

    w = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD")
    w.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
           pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=...,
           kv_data_type=..., sm_scale=None)
    out = w.run(q, paged_kv_cache)                          # (out, lse) with return_lse=True

(flashinfer-ai/flashinfer `flashinfer/decode.py`; the page table and cache in
`flashinfer_paged.py`). One query per request: q [B, Hq, D], out [B, Hq, D], lse [B, Hq] in
**base 2** (-inf for a request with no key, whose row is 0). As in `single_decode_with_kv_cache`
(`flashinfer_decode.py`): the query sits after the last key, so it sees all of them, and
`window_left = w` keeps keys j >= kv_len - 1 - w; `logits_soft_cap` c is c * tanh(x / c) on the
scaled logits. There is one head dim: Dv = Dk.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from attnconf.reference import Case

from ..base import Result
from . import flashinfer_paged as paged
from .common import ConventionAdapter, lengths, lse_to_spec
from .flashinfer_decode import FEATURES as SINGLE_FEATURES
from .flashinfer_decode import FlashInferDecode
from .flashinfer_prefill import kv_layout

KEYWORDS = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "sm_scale")
FEATURES = (SINGLE_FEATURES - {"noncontiguous"}) | {"paged"}
OUTSIDE = ("more than one query (Lq > 1)", "gradients (no backward)", "dropout", "masks", "additive bias",
           "top-left causal or window with Lk > 1", "ALiBi", "attention sinks", "Dv != Dk",
           "non-contiguous or stride-0 (broadcast) inputs")


class FlashInferBatchDecode(FlashInferDecode):
    def check_signature(self, fn: Callable[..., Any]) -> str | None:
        return paged.check_wrapper_class(fn, self.entry, self.name)

    def requirements(self, case: Case) -> set[str]:
        return super().requirements(case) | {"paged"}

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError(f"the {self.name} convention has no backward")
        s = case.shape
        _, kl = lengths(case)
        layout = kv_layout(case)
        pg = paged.pages(case, kl)
        q = ad.tensor(np.ascontiguousarray(case.q[:, :, 0]), case.dtype)          # [B, Hq, D]
        plan_args = (paged.int32(ad, pg.indptr), paged.int32(ad, pg.indices), paged.int32(ad, pg.last_page_len),
                     s["Hq"], s["Hkv"], s["Dk"], pg.page_size)
        plan_kwargs = dict(pos_encoding_mode="NONE", window_left=-1 if case.window is None else int(case.window[0]),
                           logits_soft_cap=None if case.softcap is None else float(case.softcap),
                           q_data_type=q.dtype, kv_data_type=q.dtype,
                           sm_scale=None if case.scale is None else float(case.scale))
        cache = paged.cache_tensor(ad, pg, case.dtype, layout)
        out = np.zeros(case.out_shape)
        lse = np.full(case.out_shape[:3], -np.inf) if want_lse else None
        dtype = case.dtype
        for with_lse in ((False, True) if want_lse else (False,)):
            ret = paged.plan_and_run(ad, layout, plan_args, plan_kwargs, q, cache, with_lse)
            o_t, l_t = ad.unpack(ret, with_lse, "return_lse")
            if with_lse:
                l2 = ad.array(l_t, (s["B"], s["Hq"]), "lse [batch_size, num_qo_heads]")
                lse[:, :, 0] = lse_to_spec(l2, case, empty=-np.inf, base2=True, name=self.name,
                                           where=lambda i: f"request {i[0]}, head {i[1]}")
            else:
                out[:, :, 0] = ad.array(o_t, (s["B"], s["Hq"], s["Dv"]), "output [batch_size, num_qo_heads, head_dim]")
                dtype = ad.out_dtype(o_t)
        return Result(out=out, out_dtype=dtype, lse=lse, kernel=ad.name,
                      notes={"kv_layout": layout, "page_size": pg.page_size, "single_tensor_cache": pg.single})


CONVENTION = FlashInferBatchDecode(
    name="flashinfer_batch_decode", entry="flashinfer.BatchDecodeWithPagedKVCacheWrapper", keywords=KEYWORDS,
    features=FEATURES, default=FEATURES, outside=OUTSIDE)
