"""The `flashinfer_decode` convention: FlashInfer's `single_decode_with_kv_cache` (forward only).

    single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", ...,
                                window_left=-1, logits_soft_cap=None, sm_scale=None, ..., return_lse=False)

(flashinfer-ai/flashinfer `flashinfer/decode.py`). One request, one query: q [Hq, D] is the
query after the last key, k and v [kv_len, Hkv, D] ("NHD") or [Hkv, kv_len, D] ("HND"), GQA by
contiguous head groups. Aligned bottom-right, the query sits at position kv_len - 1, so it
sees every key (causal changes nothing, and the decode call has no causal argument) and
`window_left=w` keeps keys j >= kv_len - 1 - w. `logits_soft_cap` and `sm_scale` as in
`flashinfer_prefill`; `return_lse=True` returns (out [Hq, D], lse [Hq]) with the lse in
**base 2**, which the adapter multiplies by ln 2 (-inf for no key stays -inf).

A Case reaches it when Lq = 1 (decode against any number of keys): batch element b is
one request with kv_lengths[b] keys (a request with no key is still called: its row must
be 0). The kv layout is `case.packing["kv_layout"]`, else drawn from the case seed.
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case

from ..base import Result
from .common import Convention, ConventionAdapter, bottom_right_requirements, lengths, lse_to_spec
from .flashinfer_prefill import kv_layout, kv_tensor

KEYWORDS = ("q", "k", "v", "kv_layout", "pos_encoding_mode", "window_left", "logits_soft_cap", "sm_scale",
            "return_lse")
FEATURES = frozenset({"window_bottom_right", "softcap", "gqa", "custom_scale", "cross", "kv_lengths", "lse",
                      "noncontiguous"})
OUTSIDE = ("more than one query (Lq > 1)", "gradients (no backward)", "dropout", "masks", "additive bias",
           "top-left causal or window with Lk > 1", "ALiBi", "attention sinks", "Dv != Dk",
           "stride-0 (broadcast) K/V")


class FlashInferDecode(Convention):
    def requirements(self, case: Case) -> set[str]:
        f = bottom_right_requirements(case)
        f.discard("causal_bottom_right")     # one query at the end of the keys sees all of them anyway
        return f

    def expressible(self, case: Case):
        if case.shape["Lq"] != 1:
            return f"decode takes one query per request; this case has Lq = {case.shape['Lq']}"
        return True

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError("the flashinfer_decode convention has no backward")
        s = case.shape
        _, kl = lengths(case)
        layout = kv_layout(case, ad.contract)
        nc = case.layout == "noncontiguous"
        out = np.zeros(case.out_shape)
        lse = np.full(case.out_shape[:3], -np.inf) if want_lse else None
        dtype = case.dtype
        for b in range(s["B"]):
            m = int(kl[b])
            for with_lse in ((False, True) if want_lse else (False,)):
                q = ad.tensor(case.q[b, :, 0], case.dtype)
                if nc:   # a (Hq, D) view with a row stride of 2 D
                    q = torch.stack([q, q], dim=1)[:, 0]
                kwargs = dict(q=q, k=kv_tensor(ad, case.k[b, :, :m], case.dtype, layout, nc),
                              v=kv_tensor(ad, case.v[b, :, :m], case.dtype, layout, nc), kv_layout=layout,
                              pos_encoding_mode="NONE", window_left=-1 if case.window is None else int(case.window[0]),
                              logits_soft_cap=None if case.softcap is None else float(case.softcap),
                              sm_scale=None if case.scale is None else float(case.scale), return_lse=with_lse)
                with torch.no_grad():
                    ret = ad.invoke(kwargs, None)
                o_t, l_t = ad.unpack(ret, with_lse, "return_lse")
                if with_lse:
                    l2 = ad.array(l_t, (s["Hq"],), f"lse [num_qo_heads] of request {b}")
                    lse[b, :, 0] = lse_to_spec(l2, case, empty=-np.inf, base2=True, name=self.name,
                                               where=lambda i, b=b: f"request {b}, head {i[0]}")
                else:
                    out[b, :, 0] = ad.array(o_t, (s["Hq"], s["Dv"]), f"output of request {b}")
                    dtype = ad.out_dtype(o_t)
        return Result(out=out, out_dtype=dtype, lse=lse, kernel=ad.name, notes={"kv_layout": layout})


CONVENTION = FlashInferDecode(
    name="flashinfer_decode", entry="flashinfer.single_decode_with_kv_cache", keywords=KEYWORDS,
    features=FEATURES, default=FEATURES, outside=OUTSIDE)
