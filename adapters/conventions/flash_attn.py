"""The `flash_attn` convention: flash-attention's `flash_attn_func`.

    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)

(Dao-AILab/flash-attention `flash_attn/flash_attn_interface.py`). Every argument is
bound by keyword. What the convention says, and how a Case maps onto it:

- layout (B, L, H, D): the Case's (B, H, L, D) arrays are transposed; layout
  "noncontiguous" passes the transposed view itself, "broadcast_kv" a stride-0
  batch; the output (B, Lq, Hq, Dv) is transposed back;
- GQA by contiguous head groups (query head h uses KV head h // (Hq / Hkv)), which is
  the spec's grouping (ATTN-GQA-1);
- `causal=True` and `window_size=(left, right)` align bottom-right: query i sees keys
  i + Lk - Lq - left <= j <= i + Lk - Lq + right, both bounds inclusive, -1 unbounded
  (`csrc/flash_attn/src/mask.h`); causal with a window keeps the left bound and sets the
  right one to 0 (`flash_api.cpp`), which is the spec's intersection. Top-left causal or
  window reach the kernel only where they coincide with bottom-right (Lq == Lk);
- `softcap=c` applies c * tanh(x / c) to the scaled logits before ALiBi and masking
  (`flash_api.cpp` folds it into the scale), 0.0 = off;
- `alibi_slopes` (Hq,) or (B, Hq) add -slope * |i + Lk - Lq - j| (the docstring). They are
  float32 as upstream requires, whatever the case's dtype; slopes float32 cannot hold are outside;
- `dropout_p` with torch's RNG seeded by `case.seed` (the statistics, not the stream, are judged);
- `return_attn_probs=True` returns (out, softmax_lse (B, H, Lq), S_dmask); the lse is natural
  log and a row that sees no key has lse = +inf (`softmax.h`, `normalize_softmax_lse`); the
  adapter maps +inf to the spec's -inf, and any other non-finite lse is a ConventionViolation
  (ATTN-LSE-2). S_dmask is "for testing only" upstream and is not judged. The output and
  gradients come from a call with `return_attn_probs=False`; a second call with True gives the lse.

Outside the convention (recorded unsupported): masks, bias, padding (use
`flash_attn_varlen`), top-left alignment with Lq != Lk, sinks. `deterministic` is
always False (it only changes the backward's reduction order upstream).
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case

from ..base import Result
from .common import Convention, ConventionAdapter, torch_dtype_of_slopes

KEYWORDS = ("q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
            "deterministic", "return_attn_probs")
FEATURES = frozenset({"causal_bottom_right", "window_bottom_right", "softcap", "alibi", "gqa", "custom_scale",
                      "cross", "dv_ne_dk", "dropout", "lse", "grads", "noncontiguous", "broadcast_kv"})
OUTSIDE = ("boolean masks", "additive bias", "query/key padding (flash_attn_varlen expresses it)",
           "top-left causal or window with Lq != Lk", "attention sinks", "the returned S_dmask")


def bhld_to_blhd(ad: ConventionAdapter, x: np.ndarray, case: Case, *, grads: bool, kv: bool,
                 leaves: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """One of q, k, v as the kernel sees it, (B, L, H, D), in the case's layout; the leaf for
    autograd is kept in the spec's (B, H, L, D) layout in `leaves`."""
    if kv and case.layout == "broadcast_kv" and not grads:
        base = ad.tensor(x[:1], case.dtype).transpose(1, 2).contiguous()
        return base.expand(x.shape[0], -1, -1, -1)
    t = ad.tensor(x, case.dtype, grads=grads)
    if grads:
        leaves[name] = t
    t = t.transpose(1, 2)
    return t if case.layout == "noncontiguous" else t.contiguous()


def common_keywords(ad: ConventionAdapter, case: Case) -> dict:
    """softmax_scale, causal, window_size, softcap, alibi_slopes as the flash-attention family takes them."""
    slopes = None
    if case.alibi_slopes is not None:
        slopes = ad.tensor(case.alibi_slopes, torch_dtype_of_slopes(case))
    return dict(softmax_scale=None if case.scale is None else float(case.scale),
                causal=case.causal is not None,
                window_size=tuple(int(w) for w in case.window) if case.window is not None else (-1, -1),
                softcap=0.0 if case.softcap is None else float(case.softcap),
                alibi_slopes=slopes)


class FlashAttn(Convention):
    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        s = case.shape
        B, Hq, Lq, Dv = s["B"], s["Hq"], s["Lq"], s["Dv"]
        leaves: dict[str, torch.Tensor] = {}
        q = bhld_to_blhd(ad, case.q, case, grads=grads, kv=False, leaves=leaves, name="dq")
        k = bhld_to_blhd(ad, case.k, case, grads=grads, kv=True, leaves=leaves, name="dk")
        v = bhld_to_blhd(ad, case.v, case, grads=grads, kv=True, leaves=leaves, name="dv")
        kwargs = dict(q=q, k=k, v=v, dropout_p=float(case.dropout_p), **common_keywords(ad, case),
                      deterministic=False, return_attn_probs=False)
        seed = case.seed if case.dropout_p else None
        ret = ad.invoke(kwargs, seed)
        out_t, _ = ad.unpack(ret, False, "return_attn_probs")
        out = ad.array(out_t, (B, Lq, Hq, Dv), "output").transpose(0, 2, 1, 3)
        res = Result(out=np.ascontiguousarray(out), out_dtype=ad.out_dtype(out_t), kernel=ad.name)
        if grads:
            go = ad.tensor(case.grad_out, case.dtype).transpose(1, 2)
            res.grads = ad.backward(out_t, leaves, go)
        if want_lse:
            with torch.no_grad():
                ret = ad.invoke({**kwargs, "return_attn_probs": True}, seed)
            out2_t, lse_t = ad.unpack(ret, True, "return_attn_probs")
            res.out_with_lse = ad.array(out2_t, (B, Lq, Hq, Dv), "output (return_attn_probs=True)").transpose(0, 2, 1, 3)
            lse = ad.array(lse_t, (B, Hq, Lq), "lse (B, H, Lq)")
            res.lse = lse_from_flash(lse, case, self.name)
        return res

    def run_raw(self, ad, q, k, v, dtype):
        t = [ad.tensor(x, dtype).transpose(1, 2).contiguous() for x in (q, k, v)]
        ret = ad.fn(q=t[0], k=t[1], v=t[2])
        return (ret[0] if isinstance(ret, (tuple, list)) else ret).detach().cpu().float().numpy()


def lse_from_flash(lse: np.ndarray, case: Case, name: str) -> np.ndarray:
    """flash-attention's lse (B, H, Lq) in the spec's terms: +inf (a row that sees no key) -> -inf."""
    from .common import lse_to_spec

    return lse_to_spec(lse, case, empty=np.inf, base2=False, name=name,
                       where=lambda i: f"batch {i[0]}, head {i[1]}, query {i[2]}")


CONVENTION = FlashAttn(
    name="flash_attn", entry="flash_attn.flash_attn_func", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE)
