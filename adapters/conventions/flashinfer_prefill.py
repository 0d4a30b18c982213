"""The `flashinfer_prefill` convention: FlashInfer's `single_prefill_with_kv_cache` (forward only).

    single_prefill_with_kv_cache(q, k, v, ..., custom_mask=None, causal=False, kv_layout="NHD",
                                 pos_encoding_mode="NONE", sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, ..., return_lse=False)

(flashinfer-ai/flashinfer `flashinfer/prefill.py`; masking in
`include/flashinfer/attention/variants.cuh`, `DefaultAttention`). One request per call:
q [qo_len, Hq, D], k and v [kv_len, Hkv, D] ("NHD") or [Hkv, kv_len, D] ("HND"), GQA by
contiguous head groups. What the convention says, and how a Case maps onto it:

- `causal=True` is bottom-right (`tril(diagonal=kv_len - qo_len)` in its docstring);
- `custom_mask` [qo_len, kv_len] bool, True = keep, *replaces* causal ("only effective when
  custom_mask is not provided"); the adapter folds causal (and a window's right bound) into
  it and passes causal=False. A mask must be the same for every head;
- `window_left=w` keeps keys j >= i + kv_len - qo_len - w (`kv_idx + qo_len + window_left >=
  kv_len + qo_idx`, inclusive), -1 = unbounded. There is no right bound: a window (w, r)
  reaches the kernel only with causal (r does not matter then), with r = 0 (which is causal),
  or folded into a custom mask;
- `logits_soft_cap=c` is c * tanh(x / c) on the scaled logits, None = off; `sm_scale` the scale;
- `return_lse=True` returns (out, lse [qo_len, Hq]) with the lse in **base 2** (FlashInfer
  works in log2 units; flashinfer-ai/flashinfer#2113). The adapter multiplies by ln 2. A row
  that sees no key has lse log2(0) = -inf there, which is the spec's value already.

A Case's batch is B requests, one call each; q_lengths / kv_lengths slice each request
(qo_len = q_lengths[b], kv_len = kv_lengths[b]; an empty request is not called: its rows are
the spec's 0 and lse -inf, written by the adapter, like the padded query rows, which the
convention has no place for). The kv layout is `case.packing["kv_layout"]` ("NHD" or "HND"),
else drawn from the case seed. FlashInfer's ALiBi (`pos_encoding_mode="ALIBI"`) uses fixed
slopes and `slope * (j - i)` before the soft cap, not the spec's ALiBi: outside the convention.
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case

from ..base import Result
from .common import Convention, ConventionAdapter, bottom_right_requirements, lengths, lse_to_spec, poisoned_tail

KEYWORDS = ("q", "k", "v", "custom_mask", "causal", "kv_layout", "pos_encoding_mode", "sm_scale", "window_left",
            "logits_soft_cap", "return_lse")
FEATURES = frozenset({"mask", "causal_bottom_right", "window_bottom_right", "mask_with_causal", "softcap", "gqa",
                      "custom_scale", "cross", "dv_ne_dk", "q_lengths", "kv_lengths", "lse", "noncontiguous"})
OUTSIDE = ("gradients (no backward)", "dropout", "additive bias", "masks that differ between heads",
           "sliding windows with a right bound other than 0 (without causal or a mask)",
           "top-left causal or window with len_q != len_k", "the spec's ALiBi", "attention sinks",
           "stride-0 (broadcast) K/V")


def kv_layout(case: Case, contract=None) -> str:
    """case.packing["kv_layout"], else drawn from the case seed among the layouts the kernel declares it takes."""
    layout = case.packing.get("kv_layout")
    if layout is None:
        pool = [x for x in ("HND", "NHD") if contract is None or contract.takes(x)] or ["HND", "NHD"]
        return pool[0] if len(pool) == 1 else ("HND" if np.random.default_rng([case.seed, 31]).random() < 0.5 else "NHD")
    if layout not in ("NHD", "HND"):
        raise ValueError(f"packing['kv_layout'] must be 'NHD' or 'HND'; got {layout!r}")
    return layout


def kv_tensor(ad: ConventionAdapter, x: np.ndarray, dtype: str, layout: str, noncontiguous: bool) -> torch.Tensor:
    """x (Hkv, L, D) as the kernel takes it: NHD [L, Hkv, D] or HND [Hkv, L, D]; non-contiguous as a
    transposed view of the other layout. A contiguous one starts a buffer whose tail holds NaN (a read
    past its last key shows, ATTN-MEM-1)."""
    t = ad.tensor(x, dtype)                                   # (H, L, D) contiguous = HND
    if layout == "HND":
        return t.transpose(0, 1).contiguous().transpose(0, 1) if noncontiguous else poisoned_tail(t)
    return t.transpose(0, 1) if noncontiguous else poisoned_tail(t.transpose(0, 1).contiguous())


def window_right(case: Case) -> int:
    return -1 if case.window is None else int(case.window[1])


class FlashInferPrefill(Convention):
    def expressible(self, case: Case):
        if case.mask is not None:
            s = case.shape
            m = np.broadcast_to(case.mask, (s["B"], s["Hq"], s["Lq"], s["Lk"]))
            if not (m == m[:, :1]).all():
                return "a mask that differs between heads (custom_mask is [qo_len, kv_len])"
        r = window_right(case)
        if r > 0 and case.causal is None and case.mask is None:
            return f"a window with right bound {r} (FlashInfer windows have only window_left)"
        return True

    def request(self, ad: ConventionAdapter, case: Case, b: int, layout: str, want_lse: bool) -> dict:
        """The keyword arguments for request b."""
        ql, kl = lengths(case)
        n, m = int(ql[b]), int(kl[b])
        t, nc = case.dtype, case.layout == "noncontiguous"
        q = ad.tensor(case.q[b, :, :n], t).transpose(0, 1)
        q = q if nc else q.contiguous()
        k = kv_tensor(ad, case.k[b, :, :m], t, layout, nc)
        v = kv_tensor(ad, case.v[b, :, :m], t, layout, nc)
        r = window_right(case)
        causal = case.causal is not None or r == 0
        custom = None
        if case.mask is not None:
            sh = case.shape
            vis = np.broadcast_to(case.mask, (sh["B"], sh["Hq"], sh["Lq"], sh["Lk"]))[b, 0, :n, :m]
            i = np.arange(n)[:, None] + (m - n)
            j = np.arange(m)[None, :]
            if causal:
                vis = vis & (j <= i)
            if r > 0:
                vis = vis & (j <= i + r)
            custom = torch.from_numpy(np.array(vis, dtype=bool)).to(ad.device)
            causal = False
        return dict(q=q, k=k, v=v, custom_mask=custom, causal=causal, kv_layout=layout, pos_encoding_mode="NONE",
                    sm_scale=None if case.scale is None else float(case.scale),
                    window_left=-1 if case.window is None else int(case.window[0]),
                    logits_soft_cap=None if case.softcap is None else float(case.softcap), return_lse=want_lse)

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError("the flashinfer_prefill convention has no backward")
        s = case.shape
        ql, _ = lengths(case)
        layout = kv_layout(case, ad.contract)
        out = np.zeros(case.out_shape)
        lse = np.full(case.out_shape[:3], -np.inf) if want_lse else None
        dtype = case.dtype
        for b in range(s["B"]):
            n = int(ql[b])
            if n == 0:
                continue
            for with_lse in ((False, True) if want_lse else (False,)):
                kwargs = self.request(ad, case, b, layout, with_lse)
                with torch.no_grad():
                    ret = ad.invoke(kwargs, None)
                o_t, l_t = ad.unpack(ret, with_lse, "return_lse")
                if with_lse:
                    l2 = ad.array(l_t, (n, s["Hq"]), f"lse [qo_len, num_qo_heads] of request {b}")
                    lse[b, :, :n] = lse_to_spec(l2.T, case, empty=-np.inf, base2=True, name=self.name,
                                                where=lambda i, b=b: f"request {b}, head {i[0]}, query {i[1]}")
                else:
                    out[b, :, :n] = ad.array(o_t, (n, s["Hq"], s["Dv"]), f"output of request {b}").transpose(1, 0, 2)
                    dtype = ad.out_dtype(o_t)
        return Result(out=out, out_dtype=dtype, lse=lse, kernel=ad.name, notes={"kv_layout": layout})


CONVENTION = FlashInferPrefill(
    name="flashinfer_prefill", entry="flashinfer.single_prefill_with_kv_cache", keywords=KEYWORDS,
    features=FEATURES, default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE)
