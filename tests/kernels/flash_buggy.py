"""The convention catalogue: copies of the kernels of `tests.kernels.flash` with exactly one defect each.

Each kernel is built by the same factory as its correct twin with one stage replaced
(`flash.replace(...)`), so the upstream signature is untouched. `@bug(clause, convention)`
records the clause it should trip and the convention to call it in; the docstring names the
defect and where it was seen for real. The suite must fail every one of them
(tests/test_catalogue_conventions.py); a bug it misses is a gap in a property or a
strategy, never a reason to weaken the bug.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from . import flash
from .flash import (LOG2E, make_flash_attn_func, make_flash_attn_varlen_func, make_flash_attn_with_kvcache,
                    make_single_decode_with_kv_cache, make_single_prefill_with_kv_cache, replace)

BUGS: dict[str, Callable] = {}


def bug(fn: Callable, *, clause: str, convention: str, doc: str) -> Callable:
    """Register a buggy kernel: the clause it should trip, the convention it is called in, its defect."""
    fn.clause, fn.convention = clause, convention
    fn.__doc__ = f"Defect: {doc} Trips {clause}."
    BUGS[fn.__name__] = fn
    globals()[fn.__name__] = fn          # so that --kernel=tests.kernels.flash_buggy:NAME finds it
    return fn


# ---- defective stages ------------------------------------------------------------------
def _window(left_op, right_op, offset_of=None):
    """A visibility stage whose window bounds use the given comparisons (and maybe another offset)."""
    def visible(lq, lk, causal, window, offset, device):
        left, right = window
        i = torch.arange(lq, device=device)[:, None]
        j = torch.arange(lk, device=device)[None, :]
        vis = torch.ones(lq, lk, dtype=torch.bool, device=device)
        if causal:
            vis &= j <= i + offset
        w = i + (offset if offset_of is None else offset_of(offset))
        if left >= 0:
            vis &= left_op(j, w - left)
        if right >= 0:
            vis &= right_op(j, w + right)
        return vis
    return visible


def _causal_top_left(lq, lk, causal, window, offset, device):
    vis = flash.visible(lq, lk, False, window, offset, device)
    if causal:
        vis &= torch.ones(lq, lk, dtype=torch.bool, device=device).tril()      # j <= i, whatever Lq and Lk
    return vis


def _softcap_after_mask(q, k, scale, cap, slopes, vis, offset, st):
    s = st.logits(q, k, scale)
    if slopes is not None:
        s = s + st.alibi(slopes.to(s.dtype), q.shape[-2], k.shape[-2], offset)
    return st.softcap(torch.where(vis, s, -math.inf), cap)                     # -inf becomes -cap: leaks


def _alibi(distance):
    def alibi(slopes, lq, lk, offset):
        i = torch.arange(lq, device=slopes.device)[:, None]
        j = torch.arange(lk, device=slopes.device)[None, :]
        return slopes[:, None, None] * distance(i, j, offset).to(slopes.dtype)
    return alibi


def _softmax_no_guard(s, vis):
    m = s.amax(dim=-1, keepdim=True).detach() if s.shape[-1] else torch.zeros((*s.shape[:-1], 1), dtype=s.dtype)
    p = torch.where(vis, torch.exp(s - m), 0.0)
    l = p.sum(dim=-1, keepdim=True)
    return p / l, m[..., 0] + torch.log(l[..., 0])                              # 0 / 0 for a row with no key


# ---- flash_attn ------------------------------------------------------------------------------
bug(make_flash_attn_func(replace(visible=_window(lambda j, b: j > b, lambda j, b: j <= b)), "window_left_exclusive"),
    clause="ATTN-WIN-1", convention="flash_attn",
    doc="the window's left bound is exclusive (j > i + off - left), one key short on the left "
        "(huggingface/transformers#39408, vllm-project/vllm#3385 are off-by-ones of this kind).")
bug(make_flash_attn_func(replace(visible=_window(lambda j, b: j >= b, lambda j, b: j < b)), "window_right_exclusive"),
    clause="ATTN-WIN-1", convention="flash_attn", doc="the window's right bound is exclusive (j < i + off + right).")
bug(make_flash_attn_func(replace(visible=_window(lambda j, b: j >= b, lambda j, b: j <= b, lambda off: 0)),
                         "window_top_left"),
    clause="ATTN-WIN-1", convention="flash_attn", doc="the window is aligned top-left (offset 0) instead of bottom-right.")
bug(make_flash_attn_func(replace(visible=_causal_top_left), "causal_top_left"),
    clause="ATTN-CAUSAL-1", convention="flash_attn",
    doc="causal is aligned top-left (j <= i) instead of bottom-right when Lq != Lk (Dao-AILab/flash-attention#951 "
        "moved it in 2.1).")
bug(make_flash_attn_func(replace(scores=_softcap_after_mask), "softcap_after_mask"),
    clause="ATTN-CAP-1", convention="flash_attn",
    doc="softcap is applied after masking, so a masked logit becomes -softcap instead of -inf and leaks.")
bug(make_flash_attn_func(replace(softcap=lambda s, cap: s), "softcap_ignored"),
    clause="ATTN-ARG-1", convention="flash_attn", doc="softcap is accepted and ignored (sgl-project/sglang#33915).")
bug(make_flash_attn_func(replace(alibi=_alibi(lambda i, j, off: (i + off - j).abs())), "alibi_sign"),
    clause="ATTN-ALIBI-1", convention="flash_attn", doc="ALiBi adds +slope * |i + off - j| (wrong sign).")
bug(make_flash_attn_func(replace(alibi=_alibi(lambda i, j, off: -(i - j).abs())), "alibi_top_left"),
    clause="ATTN-ALIBI-1", convention="flash_attn",
    doc="ALiBi distances are |i - j|, not aligned bottom-right (|i + Lk - Lq - j|).")
bug(make_flash_attn_func(replace(alibi=_alibi(lambda i, j, off: j - i - off)), "alibi_no_abs"),
    clause="ATTN-ALIBI-1", convention="flash_attn",
    doc="ALiBi adds slope * (j - i - off) without the absolute value: right only under causal masking.")
bug(make_flash_attn_func(replace(alibi=lambda slopes, lq, lk, off: torch.zeros((slopes.shape[0], lq, lk),
                                                                              dtype=slopes.dtype)), "alibi_ignored"),
    clause="ATTN-ARG-1", convention="flash_attn", doc="alibi_slopes are accepted and ignored.")
bug(make_flash_attn_func(replace(group=lambda x, hq: x.repeat(hq // x.shape[0], 1, 1)), "gqa_tile"),
    clause="ATTN-GQA-1", convention="flash_attn",
    doc="GQA groups heads by tile (query head h uses KV head h % Hkv) instead of contiguously (jax-js#180).")
bug(make_flash_attn_func(replace(flash_lse=lambda lse: flash.flash_empty_lse(lse) / math.log(2.0)), "lse_base2"),
    clause="ATTN-LSE-1", convention="flash_attn",
    doc="the returned lse is in base 2 (flashinfer-ai/flashinfer#2113 broke context-parallel merges this way).")
bug(make_flash_attn_func(replace(flash_lse=lambda lse: lse), "lse_empty_neg_inf"),
    clause="ATTN-LSE-2", convention="flash_attn",
    doc="a row that sees no key returns lse -inf, where the flash-attention convention says +inf.")
bug(make_flash_attn_func(replace(dropout=lambda w, p: w), "dropout_ignored"),
    clause="ATTN-ARG-1", convention="flash_attn",
    doc="dropout_p is accepted and ignored (SageAttention's **kwargs swallow dropout_p).")

# ---- flash_attn_varlen ----------------------------------------------------------------------
bug(make_flash_attn_varlen_func(replace(offset=lambda lq, lk, max_lq, max_lk: max_lk - max_lq), "varlen_global_offset"),
    clause="ATTN-CAUSAL-1", convention="flash_attn_varlen",
    doc="causal, window and ALiBi align on max_seqlen_k - max_seqlen_q instead of each sequence's own lengths "
        "(Dao-AILab/flash-attention#1192 used the global seqlen in split-KV).")
bug(make_flash_attn_varlen_func(replace(key_span=lambda cu, i, max_k: (cu[i], cu[i] + max_k)), "varlen_leaky"),
    clause="ATTN-VARLEN-1", convention="flash_attn_varlen",
    doc="each sequence reads max_seqlen_k keys from its start, seeing the next sequence's keys.")
bug(make_flash_attn_varlen_func(replace(softmax=_softmax_no_guard), "varlen_empty_nan"),
    clause="ATTN-VARLEN-2", convention="flash_attn_varlen",
    doc="rows that see no key (a sequence with more queries than keys, under causal) output NaN (0/0) instead "
        "of 0 (Dao-AILab/flash-attention#1537 broke on empty sequences).")

# ---- flash_attn_kvcache --------------------------------------------------------------------
bug(make_flash_attn_with_kvcache(replace(append_at=lambda seqlen: seqlen + 1), "kvcache_append_off_by_one"),
    clause="ATTN-PAGED-3", convention="flash_attn_kvcache",
    doc="new keys are written one slot past cache_seqlens (and the slot at cache_seqlens is read as a key).")
bug(make_flash_attn_with_kvcache(replace(keys_read=lambda total, new: total - new), "kvcache_new_keys_ignored"),
    clause="ATTN-PAGED-3", convention="flash_attn_kvcache",
    doc="the new keys are written into the cache but not attended to.")
bug(make_flash_attn_with_kvcache(replace(block_of=lambda table, b, t, page: b * table.shape[1] + t // page),
                                 "paged_block_table_ignored"),
    clause="ATTN-PAGED-1", convention="flash_attn_kvcache",
    doc="the paged cache ignores block_table and reads sequence b's blocks at b * blocks_per_seq + j.")
bug(make_flash_attn_with_kvcache(replace(keys_read=lambda total, new: max(total - 1, 0)), "kvcache_one_key_short"),
    clause="ATTN-OP-1", convention="flash_attn_kvcache", doc="decoding reads one key too few (the last one).")
bug(make_flash_attn_with_kvcache(replace(block_of=lambda table, b, t, page: table[b, (t - 1).clamp(min=0) // page]),
                                 "paged_page_start_in_previous_block"),
    clause="ATTN-PAGED-2", convention="flash_attn_kvcache",
    doc="the first slot of every page after the first is looked up in the previous page's block (t - 1 in the "
        "block index): a paged cache differs from the contiguous one, which is right.")

# ---- FlashInfer ---------------------------------------------------------------------------------
bug(make_single_prefill_with_kv_cache(replace(flashinfer_lse=lambda lse: lse), "flashinfer_lse_natural"),
    clause="ATTN-LSE-1", convention="flashinfer_prefill",
    doc="the lse is natural log where the FlashInfer convention says base 2.")
bug(make_single_prefill_with_kv_cache(replace(visible=_window(lambda j, b: j > b, lambda j, b: j <= b)),
                                      "flashinfer_window_exclusive"),
    clause="ATTN-WIN-1", convention="flashinfer_prefill", doc="window_left is exclusive (one key short).")


def _ignore_mask(prefill):
    def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                     custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD",
                                     pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
                                     window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                     backend="auto", return_lse=False):
        return prefill(q, k, v, causal=causal, kv_layout=kv_layout, sm_scale=sm_scale, window_left=window_left,
                       logits_soft_cap=logits_soft_cap, return_lse=return_lse)
    single_prefill_with_kv_cache.__name__ = single_prefill_with_kv_cache.__qualname__ = "flashinfer_mask_ignored"
    return single_prefill_with_kv_cache


bug(_ignore_mask(flash.single_prefill_with_kv_cache),
    clause="ATTN-ARG-1", convention="flashinfer_prefill",
    doc="custom_mask is accepted and ignored (SageAttention's **kwargs swallow attn_mask).")
bug(make_single_decode_with_kv_cache(replace(keys_read=lambda total, new: max(total - 1, 0)), "decode_one_key_short"),
    clause="ATTN-OP-1", convention="flashinfer_decode", doc="decode reads one key too few (the newest).")


# ---- found by red-teaming the suite (each was missed before the gap it names was closed) ----------
def _window_block_skip(lq, lk, causal, window, offset, device):
    """Local attention over 128 x 128 tiles that starts each row tile at the key block where the tile's
    LAST row's window starts: earlier rows lose the keys of the blocks before it."""
    vis = flash.visible(lq, lk, causal, window, offset, device)
    if window[0] >= 0:
        for r0 in range(0, lq, 128):
            last = min(r0 + 128, lq) - 1
            vis[r0:r0 + 128, :max(last + offset - window[0], 0) // 128 * 128] = False
    return vis


bug(make_flash_attn_func(replace(visible=_window_block_skip), "window_block_skip"),
    clause="ATTN-WIN-1", convention="flash_attn",
    doc="a local kernel over 128-row tiles skips the key blocks that only the tile's earlier rows need "
        "(seen only when a window crosses a 128-key block: Lq, Lk > 128).")


def _softmax_unnormalised(s, vis):
    w, lse = flash.masked_softmax(s, vis)
    m = torch.where(vis, s, -math.inf).amax(dim=-1)
    norm = torch.where(torch.isfinite(lse), torch.exp(lse - torch.where(torch.isfinite(m), m, 0.0)), 0.0)
    return w * norm[..., None], lse                     # sum_j exp(s_j - max) V_j, never divided by the sum


_unnormalised = make_flash_attn_func(replace(softmax=_softmax_unnormalised), "_unnormalised")


def probs_path_unnormalised(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    kernel = _unnormalised if return_attn_probs else flash.flash_attn_func
    return kernel(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                  softcap=softcap, alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs)


bug(probs_path_unnormalised, clause="ATTN-OP-1", convention="flash_attn",
    doc="with return_attn_probs=True the output is never divided by the softmax sum (the lse is right); "
        "the default call is correct.")


def lse_in_input_dtype(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
                       packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                       use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
                       rope_scale=None, rope_theta=None, backend="auto", return_lse=False):
    ret = flash.single_prefill_with_kv_cache(q, k, v, custom_mask=custom_mask, causal=causal, kv_layout=kv_layout,
                                             sm_scale=sm_scale, window_left=window_left,
                                             logits_soft_cap=logits_soft_cap, return_lse=return_lse)
    return (ret[0], ret[1].to(q.dtype)) if return_lse else ret


bug(lse_in_input_dtype, clause="ATTN-LSE-1", convention="flashinfer_prefill",
    doc="the lse comes back in the inputs' dtype (float16/bfloat16) instead of float32, which split-KV and "
        "context-parallel merges read.")


# ---- found by the second red-team round (2026-11-25) ------------------------------------------------
def _even_k_span(cu, i, max_k):
    """flash-attention's even-K fast path chosen from the pack's max_seqlen_k: when it is a multiple of the
    64-key block, every sequence is read in whole blocks from its start, past its own keys."""
    if max_k % 64:
        return cu[i], cu[i + 1]
    return cu[i], cu[i] + -(-(cu[i + 1] - cu[i]) // 64) * 64


bug(make_flash_attn_varlen_func(replace(key_span=_even_k_span), "varlen_even_k_global"),
    clause="ATTN-VARLEN-1", convention="flash_attn_varlen",
    doc="the 'every key block is full' path is chosen from max_seqlen_k % 64 == 0 for the whole pack, so a "
        "shorter sequence that is not last reads the next sequence's keys (seen only without causal masking "
        "or a right window bound, which hide the extra keys).")


def _pv_wide_v_stale(w, v, s):
    """P V of a kernel that tiles keys by 64, keeps a reference max that moves only when a block's max exceeds
    it by more than 8 in log2 units (conditional rescaling), and rescales only the first 128 columns of the
    output accumulator when it moves: columns 128 and up keep each earlier block's contribution at its old
    scale, exp(m_final - m_block) too large."""
    out = w @ v
    lk, dv = s.shape[-1], v.shape[-1]
    if dv <= 128 or lk <= 64:
        return out
    nb = -(-lk // 64)
    pad = torch.full((*s.shape[:-1], nb * 64 - lk), -math.inf, dtype=s.dtype, device=s.device)
    block_max = torch.cat([s.detach(), pad], dim=-1).unflatten(-1, (nb, 64)).amax(dim=-1)
    ref = torch.full(s.shape[:-1], -math.inf, dtype=s.dtype, device=s.device)
    refs = []
    for b in range(nb):
        moves = torch.isneginf(ref) | (block_max[..., b] - ref > 8.0 / LOG2E)
        ref = torch.where(moves, torch.maximum(ref, block_max[..., b]), ref)
        refs.append(ref)
    refs = torch.stack(refs, dim=-1)
    stale = torch.where(torch.isneginf(refs), 0.0, refs[..., -1:] - refs)
    factor = torch.exp(stale).repeat_interleave(64, dim=-1)[..., :lk]
    return torch.cat([out[..., :128], (w * factor) @ v[..., 128:]], dim=-1)


bug(make_flash_attn_func(replace(pv=_pv_wide_v_stale), "wide_v_stale_rescale"),
    clause="ATTN-OP-1", convention="flash_attn",
    doc="with conditional rescaling over 64-key blocks, only the first 128 output columns are rescaled when the "
        "row's reference max moves (seen only with Dv > 128, Lk > 64 and a max that rises sharply in a later "
        "key block).")


# ---- a dishonest declaration ---------------------------------------------------------------------
def declares_float32_unimplemented(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                   softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    if q.dtype == torch.float32:
        raise NotImplementedError("float32 is not implemented")
    return flash.flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                 window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                 return_attn_probs=return_attn_probs)


declares_float32_unimplemented.attnconf_capabilities = {"dtypes": ["float32", "float16"]}
bug(declares_float32_unimplemented, clause="ATTN-SCOPE-1", convention="flash_attn",
    doc="declares float32 but raises NotImplementedError on every float32 case (so nothing in float32 would be "
        "judged).")
