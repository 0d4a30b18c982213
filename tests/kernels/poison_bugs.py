"""Kernels that read memory they must not and weight it by zero: the catalogue of ATTN-MEM-1.

Each is a correct kernel of `tests.kernels.flash` plus one read that real tiled kernels make: the last
key tile read whole, its positions past the sequence's keys given weight 0 (p = 0 after masking the
logit to -inf), and added in as p @ V. On finite garbage that adds exactly nothing, so these kernels
passed while unread slots held finite values; with NaN there, 0 x NaN = NaN reaches the output. The
kernels of flash-attention and FlashInfer guard such tiles with predicated loads; missing the guard is
the out-of-bounds read of paged and varlen bugs.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import flash

TILE = 64
BUGS: dict[str, Callable] = {}


def bug(convention: str):
    def register(fn):
        fn.clause, fn.convention = "ATTN-MEM-1", convention
        BUGS[fn.__name__] = fn
        return fn
    return register


def _zero_weighted(v_rows: torch.Tensor, hq: int, lq: int) -> torch.Tensor:
    """p @ V for the over-read rows v_rows (Hkv, n, D) with p = 0: (Hq, lq, D), 0 where V is finite."""
    v = v_rows.repeat_interleave(hq // v_rows.shape[0], dim=0).float()
    return torch.zeros((hq, lq, v.shape[1]), dtype=v.dtype, device=v.device) @ v


def _tile_end(n: int, limit: int) -> int:
    return min(limit, (n // TILE + 1) * TILE)


@bug("flash_attn_kvcache")
def kvcache_last_tile_whole(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, cache_batch_idx=None,
                            block_table=None, return_softmax_lse=False, **kw):
    """Defect: reads each sequence's last key tile whole, past cache_seqlens + new keys (through the block
    table if paged), with weight 0. Trips ATTN-MEM-1."""
    ret = flash.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                        cache_batch_idx=cache_batch_idx, block_table=block_table,
                                        return_softmax_lse=return_softmax_lse, **kw)
    out = ret[0] if return_softmax_lse else ret
    b, lq, hq, _ = q.shape
    paged = block_table is not None
    page = k_cache.shape[1]
    capacity = block_table.shape[1] * page if paged else k_cache.shape[1]
    n_new = 0 if k is None else k.shape[1]
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        seqlens = [capacity if cache_seqlens is None else cache_seqlens] * b
    else:
        seqlens = [int(x) for x in cache_seqlens.tolist()]
    extra = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for bi in range(b):
        n = seqlens[bi] + n_new
        pos = torch.arange(n, _tile_end(n, capacity))
        if not len(pos):
            continue
        if paged:
            r, c = block_table[bi, pos // page].long(), pos % page
        else:
            r, c = torch.full_like(pos, bi if cache_batch_idx is None else int(cache_batch_idx[bi])), pos
        extra[bi] = _zero_weighted(v_cache[r, c].transpose(0, 1), hq, lq).transpose(0, 1)
    out = (out.float() + extra).to(out.dtype)
    return (out, ret[1]) if return_softmax_lse else out


@bug("flash_attn_varlen")
def varlen_last_tile_whole(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
    """Defect: the last packed sequence's last key tile is read whole, into the padding past
    cu_seqlens_k[-1], with weight 0. Trips ATTN-MEM-1."""
    ret = flash.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw)
    out = ret[0] if isinstance(ret, tuple) else ret
    total_k, total_q = int(cu_seqlens_k[-1]), int(cu_seqlens_q[-1])
    rows = v[total_k:_tile_end(total_k, v.shape[0])]                 # (n, Hkv, D)
    lq = total_q - int(cu_seqlens_q[-2])
    if len(rows) and lq:
        add = _zero_weighted(rows.transpose(0, 1), q.shape[1], lq).transpose(0, 1)
        out = torch.cat([out[:total_q - lq], (out[total_q - lq:total_q].float() + add).to(out.dtype), out[total_q:]])
    return (out, *ret[1:]) if isinstance(ret, tuple) else out


@bug("flashinfer_decode")
def decode_reads_past_the_end(q, k, v, kv_layout="NHD", return_lse=False, **kw):
    """Defect: reads one tile of V's memory past its last element (out of the tensor's bounds, into whatever
    follows it), with weight 0. Trips ATTN-MEM-1."""
    ret = flash.single_decode_with_kv_cache(q, k, v, kv_layout=kv_layout, return_lse=return_lse, **kw)
    out = ret[0] if return_lse else ret
    if v.is_contiguous():
        end = v.storage_offset() + v.numel()
        n = min(TILE * v.shape[-1], v.untyped_storage().nbytes() // v.element_size() - end)
        if n > 0:
            over = v.as_strided((n,), (1,), end)
            out = (out.float() + (torch.zeros(n, device=v.device) * over.float()).sum()).to(out.dtype)
    return (out, ret[1]) if return_lse else out
