"""The `flash_attn_varlen` convention: flash-attention's `flash_attn_varlen_func`.

    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False)

(Dao-AILab/flash-attention `flash_attn/flash_attn_interface.py`; its trailing
`block_table` is left at its default). Everything `flash_attn` says holds per
sequence, with Lq and Lk the sequence's own lengths: causal, windows and ALiBi
align at i + len_k - len_q (`block_info.h`: `actual_seqlen_q/k` come from cu_seqlens).

A Case is a varlen batch: batch element b is sequence b with q_lengths[b] queries
and kv_lengths[b] keys (the full Lq / Lk where a length is not given; zero is
allowed: an empty sequence). Only the valid rows are packed, into q (total_q, Hq, D)
and k, v (total_k, Hkv, D), with int32 `cu_seqlens_q/k` and int `max_seqlen_q/k`
(the longest sequence). Sequences are packed in the order `case.packing["seq_order"]`
(a permutation of the batch; drawn from the case seed when absent), so a kernel that
confuses a sequence's index with its place in the pack is caught.

What the convention cannot return: the padded query rows (i >= q_lengths[b]) have no
place in the packed output. The spec's value for them is exactly 0 (lse -inf), and the
adapter writes exactly that into the Result, so those rows are never compared with
anything the kernel did; their gradients are those of rows that are not there (zero).
Layout "noncontiguous" passes q, k, v packed as transposed (H, total, D) buffers. k and v carry
TAIL_ROWS rows of NaN after cu_seqlens_k[-1] (padding a kernel must not read, ATTN-MEM-1), as
serving stacks pad a packed batch to a fixed size.
The lse is (Hq, total_q), natural log, +inf for a row that sees no key.
"""
from __future__ import annotations

import numpy as np
import torch

from attnconf.reference import Case

from ..base import Result
from .common import TAIL_ROWS, Convention, ConventionAdapter, bottom_right_requirements, lengths
from .flash_attn import FEATURES as FLASH_FEATURES
from .flash_attn import common_keywords, lse_from_flash

KEYWORDS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "dropout_p",
            "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic", "return_attn_probs")
FEATURES = (FLASH_FEATURES - {"broadcast_kv"}) | {"varlen", "q_lengths", "kv_lengths"}
OUTSIDE = ("boolean masks", "additive bias", "top-left causal or window where a sequence has len_q != len_k",
           "attention sinks", "stride-0 (broadcast) K/V", "paged K/V (block_table)", "the returned S_dmask")


def seq_order(case: Case) -> list[int]:
    """The order in which the batch's sequences are packed (packing["seq_order"], else from the seed)."""
    b = case.shape["B"]
    order = case.packing.get("seq_order")
    if order is None:
        return [int(i) for i in np.random.default_rng([case.seed, 11]).permutation(b)]
    order = [int(i) for i in order]
    if sorted(order) != list(range(b)):
        raise ValueError(f"packing['seq_order'] must be a permutation of range({b}); got {order}")
    return order


def pack(t: torch.Tensor, lens: np.ndarray, order: list[int], noncontiguous: bool, tail: int = 0) -> torch.Tensor:
    """(B, H, L, D) -> (total + tail, H, D): the first lens[b] rows of each sequence, in `order`, then
    `tail` rows of NaN padding past cu_seqlens[-1] that the kernel must not read (ATTN-MEM-1)."""
    parts = [t[b, :, : int(lens[b])] for b in order]                 # (H, len, D) each
    if tail:
        parts.append(torch.full((t.shape[1], tail, t.shape[3]), float("nan"), dtype=t.dtype, device=t.device))
    packed = torch.cat(parts, dim=1)                                  # (H, total, D); a Case has B >= 1
    return packed.transpose(0, 1) if noncontiguous else packed.transpose(0, 1).contiguous()


def cu_seqlens(ad: ConventionAdapter, lens: np.ndarray, order: list[int]) -> torch.Tensor:
    cu = np.concatenate([[0], np.cumsum([int(lens[b]) for b in order])]).astype(np.int32)
    return torch.from_numpy(cu).to(ad.device)


def unpack(packed: np.ndarray, lens: np.ndarray, order: list[int], shape: tuple, fill: float) -> np.ndarray:
    """(total, H[, D]) -> (B, H, L[, D]) with `fill` in the rows the pack does not hold."""
    out = np.full(shape, fill)
    start = 0
    for b in order:
        n = int(lens[b])
        out[b, :, :n] = np.swapaxes(packed[start:start + n], 0, 1)
        start += n
    return out


class FlashAttnVarlen(Convention):
    def requirements(self, case: Case) -> set[str]:
        return bottom_right_requirements(case) | {"varlen"}

    def arguments(self, ad: ConventionAdapter, case: Case, *, grads: bool):
        ql, kl = lengths(case)
        order = seq_order(case)
        nc = case.layout == "noncontiguous"
        leaves = {n: ad.tensor(x, case.dtype, grads=grads) for n, x in (("dq", case.q), ("dk", case.k), ("dv", case.v))}
        kw = common_keywords(ad, case)
        if kw["alibi_slopes"] is not None and kw["alibi_slopes"].dim() == 2:
            kw["alibi_slopes"] = kw["alibi_slopes"][order]          # (batch, H): one row per packed sequence
        kwargs = dict(q=pack(leaves["dq"], ql, order, nc), k=pack(leaves["dk"], kl, order, nc, TAIL_ROWS),
                      v=pack(leaves["dv"], kl, order, nc, TAIL_ROWS), cu_seqlens_q=cu_seqlens(ad, ql, order),
                      cu_seqlens_k=cu_seqlens(ad, kl, order), max_seqlen_q=int(ql.max(initial=0)),
                      max_seqlen_k=int(kl.max(initial=0)), dropout_p=float(case.dropout_p), **kw,
                      deterministic=False, return_attn_probs=False)
        return kwargs, leaves, (ql, order)

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        s = case.shape
        kwargs, leaves, (ql, order) = self.arguments(ad, case, grads=grads)
        seed = case.seed if case.dropout_p else None
        total_q = int(ql.sum())
        out_t, _ = ad.unpack(ad.invoke(kwargs, seed), False, "return_attn_probs")
        packed = ad.array(out_t, (total_q, s["Hq"], s["Dv"]), "output (total_q, H, D)")
        out = unpack(packed, ql, order, case.out_shape, 0.0)
        res = Result(out=out, out_dtype=ad.out_dtype(out_t), kernel=ad.name)
        if grads:
            go = pack(ad.tensor(case.grad_out, case.dtype), ql, order, False)
            res.grads = ad.backward(out_t, leaves, go)
        if want_lse:
            with torch.no_grad():
                ret = ad.invoke({**kwargs, "return_attn_probs": True}, seed)
            out2_t, lse_t = ad.unpack(ret, True, "return_attn_probs")
            packed2 = ad.array(out2_t, (total_q, s["Hq"], s["Dv"]), "output (return_attn_probs=True)")
            res.out_with_lse = unpack(packed2, ql, order, case.out_shape, 0.0)
            lse = ad.array(lse_t, (s["Hq"], total_q), "lse (H, total_q)")
            lse = lse_from_flash(lse[None], case, self.name)[0]             # the sentinel check, packed
            res.lse = unpack(lse.T, ql, order, case.out_shape[:3], -np.inf)
        return res

    def run_raw(self, ad, q, k, v, dtype):
        """q, k, v packed with full lengths: a batch mismatch gives cu_seqlens of different lengths,
        a K/V length mismatch different totals, which the kernel must refuse."""
        def packed(x):
            t = ad.tensor(x, dtype)
            return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3]), t.shape[0], t.shape[2]
        (qp, bq, lq), (kp, bk, lk), (vp, _, _) = packed(q), packed(k), packed(v)
        cu = lambda b, n: torch.arange(0, (b + 1) * n, n, dtype=torch.int32)  # noqa: E731
        ret = ad.fn(q=qp, k=kp, v=vp, cu_seqlens_q=cu(bq, lq), cu_seqlens_k=cu(bk, lk), max_seqlen_q=lq,
                    max_seqlen_k=lk)
        return (ret[0] if isinstance(ret, (tuple, list)) else ret).detach().cpu().float().numpy()


CONVENTION = FlashAttnVarlen(
    name="flash_attn_varlen", entry="flash_attn.flash_attn_varlen_func", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE)
