"""The `flashinfer_batch_prefill` convention: FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` (forward only).

    w = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD")
    w.plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
           num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, causal=False,
           pos_encoding_mode="NONE", sm_scale=None, window_left=-1, logits_soft_cap=None,
           q_data_type=..., kv_data_type=...)
    out = w.run(q, paged_kv_cache)                          # (out, lse) with return_lse=True

(flashinfer-ai/flashinfer `flashinfer/prefill.py`; the page table and cache in
`flashinfer_paged.py`). q is ragged, [qo_indptr[-1], Hq, Dk] with request b's rows at
qo_indptr[b] .. qo_indptr[b + 1] - 1; out [qo_indptr[-1], Hq, Dv], lse [qo_indptr[-1], Hq] in
**base 2**, -inf for a row that sees no key. Per request the semantics are those of
`single_prefill_with_kv_cache` (`flashinfer_prefill.py`, whose per-request pieces this module
reuses): causal bottom-right, `window_left` inclusive, `custom_mask` True = keep (here flattened:
request b's qo_len x kv_len block at offset sum of the earlier blocks) and replacing causal, and
`logits_soft_cap` c: c * tanh(x / c) on the scaled logits *before* any mask.

A Case's batch is the batch of requests (q_lengths, kv_lengths per request; query padding is
not passed, the adapter writes the spec's 0 and -inf for those rows).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from attnconf.reference import Case

from ..base import Result
from . import flashinfer_paged as paged
from .common import ConventionAdapter, lengths, lse_to_spec
from .flashinfer_prefill import FEATURES as SINGLE_FEATURES
from .flashinfer_prefill import FlashInferPrefill, kv_layout

KEYWORDS = ("head_dim_vo", "custom_mask", "causal", "pos_encoding_mode", "sm_scale", "window_left", "logits_soft_cap",
            "q_data_type", "kv_data_type")
FEATURES = (SINGLE_FEATURES - {"noncontiguous"}) | {"paged"}
OUTSIDE = ("gradients (no backward)", "dropout", "additive bias", "masks that differ between heads",
           "sliding windows with a right bound other than 0 (without causal or a mask)",
           "top-left causal or window with len_q != len_k", "the spec's ALiBi", "attention sinks",
           "non-contiguous or stride-0 (broadcast) inputs")


class FlashInferBatchPrefill(FlashInferPrefill):
    def check_signature(self, fn: Callable[..., Any]) -> str | None:
        return paged.check_wrapper_class(fn, self.entry, self.name)

    def requirements(self, case: Case) -> set[str]:
        return super().requirements(case) | {"paged"}

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError(f"the {self.name} convention has no backward")
        s = case.shape
        ql, kl = lengths(case)
        layout = kv_layout(case)
        pg = paged.pages(case, kl)
        reqs = [self.request(ad, case, b, layout, False) for b in range(s["B"])]
        q = torch.cat([r["q"] for r in reqs]).contiguous()
        masks = [r["custom_mask"] for r in reqs]
        custom = None if all(m is None for m in masks) else torch.cat([m.reshape(-1) for m in masks])
        qo_indptr = np.concatenate([[0], np.cumsum(ql)])
        first = reqs[0]
        dt = q.dtype
        plan_args = (paged.int32(ad, qo_indptr), paged.int32(ad, pg.indptr), paged.int32(ad, pg.indices),
                     paged.int32(ad, pg.last_page_len), s["Hq"], s["Hkv"], s["Dk"], pg.page_size)
        plan_kwargs = dict(head_dim_vo=s["Dv"], custom_mask=custom, causal=bool(custom is None and first["causal"]),
                           pos_encoding_mode="NONE", sm_scale=first["sm_scale"], window_left=first["window_left"],
                           logits_soft_cap=first["logits_soft_cap"], q_data_type=dt, kv_data_type=dt)
        cache = paged.cache_tensor(ad, pg, case.dtype, layout)
        out = np.zeros(case.out_shape)
        lse = np.full(case.out_shape[:3], -np.inf) if want_lse else None
        dtype = case.dtype
        n = int(qo_indptr[-1])
        for with_lse in ((False, True) if want_lse else (False,)):
            ret = paged.plan_and_run(ad, layout, plan_args, plan_kwargs, q, cache, with_lse)
            o_t, l_t = ad.unpack(ret, with_lse, "return_lse")
            if with_lse:
                l2 = ad.array(l_t, (n, s["Hq"]), "lse [qo_indptr[-1], num_qo_heads]")
                l_nat = lse_to_spec(l2, case, empty=-np.inf, base2=True, name=self.name,
                                    where=lambda i: f"packed query row {i[0]}, head {i[1]}")
                for b in range(s["B"]):
                    lse[b, :, : int(ql[b])] = l_nat[qo_indptr[b]:qo_indptr[b + 1]].T
            else:
                o = ad.array(o_t, (n, s["Hq"], s["Dv"]), "output [qo_indptr[-1], num_qo_heads, head_dim_vo]")
                for b in range(s["B"]):
                    out[b, :, : int(ql[b])] = o[qo_indptr[b]:qo_indptr[b + 1]].transpose(1, 0, 2)
                dtype = ad.out_dtype(o_t)
        return Result(out=out, out_dtype=dtype, lse=lse, kernel=ad.name,
                      notes={"kv_layout": layout, "page_size": pg.page_size, "single_tensor_cache": pg.single})


CONVENTION = FlashInferBatchPrefill(
    name="flashinfer_batch_prefill", entry="flashinfer.BatchPrefillWithPagedKVCacheWrapper", keywords=KEYWORDS,
    features=FEATURES, default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE)
