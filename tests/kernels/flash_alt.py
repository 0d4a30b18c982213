"""Second, independently written correct kernels in the three flash-attention conventions.

`tests.kernels.flash` builds everything from one per-sequence core; these are written the
other way round, batched, the way a hand-written reference often is: masks as a float bias
filled with -inf, `torch.softmax` with NaN rows zeroed, `torch.logsumexp` for the lse,
`F.dropout` for dropout, varlen by padding every sequence to max_seqlen, the KV cache by
slice assignment and `torch.cat`. They must pass the suite as well: they guard the adapters
against assumptions that only the first family of kernels happens to satisfy.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _attend_batched(q, k, v, *, scale, causal, window, softcap, alibi, dropout_p, lq_len, lk_len):
    """q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D) in the compute dtype; lq_len/lk_len (B,) valid lengths.
    Returns out (B, Hq, Lq, Dv) and lse (B, Hq, Lq) with +inf for rows that see no key."""
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    g = hq // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(lq, device=q.device).view(1, lq, 1)
    j = torch.arange(lk, device=q.device).view(1, 1, lk)
    off = (lk_len - lq_len).view(b, 1, 1)
    if alibi is not None:
        sl = alibi if alibi.dim() == 2 else alibi.expand(b, hq)
        s = s - sl.to(s.dtype).view(b, hq, 1, 1) * (i + off - j).abs().unsqueeze(1).to(s.dtype)
    keep = (j < lk_len.view(b, 1, 1)) & (i < lq_len.view(b, 1, 1))
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        keep = keep & (j >= i + off - left)
    if right >= 0:
        keep = keep & (j <= i + off + right)
    s = s.masked_fill(~keep.unsqueeze(1), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(keep.unsqueeze(1), p, torch.zeros((), dtype=p.dtype))       # empty rows: NaN -> 0
    if dropout_p:
        p = F.dropout(p, p=dropout_p, training=True)
    out = p @ v
    return out, torch.where(torch.isneginf(lse), math.inf, lse)


def _ct(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    if q.dim() != 4 or k.shape != v.shape[:3] + (k.shape[3],) or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] \
            or q.shape[2] % k.shape[2]:
        raise RuntimeError(f"bad shapes {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    t = _ct(q.dtype)
    b, lq, _, d = q.shape
    lk = k.shape[1]
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    out, lse = _attend_batched(q.transpose(1, 2).to(t), k.transpose(1, 2).to(t), v.transpose(1, 2).to(t),
                               scale=scale, causal=causal, window=window_size, softcap=softcap, alibi=alibi_slopes,
                               dropout_p=dropout_p, lq_len=torch.full((b,), lq), lk_len=torch.full((b,), lk))
    out = out.transpose(1, 2).to(q.dtype)
    return (out, lse.float(), None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    t = _ct(q.dtype)
    b = cu_seqlens_q.numel() - 1
    if cu_seqlens_k.numel() - 1 != b or v.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise RuntimeError("inconsistent varlen arguments")
    lq_len = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    lk_len = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
    hq, hk, d, dv = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    mq, mk = max(int(max_seqlen_q), 1), max(int(max_seqlen_k), 1)
    qp = q.new_zeros((b, mq, hq, d), dtype=t)
    kp, vp = k.new_zeros((b, mk, hk, d), dtype=t), v.new_zeros((b, mk, hk, dv), dtype=t)
    rows_q, rows_k = [], []
    for i in range(b):
        a, n = int(cu_seqlens_q[i]), int(lq_len[i])
        qp = qp.index_put((torch.tensor([i]), torch.arange(n)), q[a:a + n].to(t))
        rows_q.append((i, a, n))
        a2, n2 = int(cu_seqlens_k[i]), int(lk_len[i])
        kp = kp.index_put((torch.tensor([i]), torch.arange(n2)), k[a2:a2 + n2].to(t))
        vp = vp.index_put((torch.tensor([i]), torch.arange(n2)), v[a2:a2 + n2].to(t))
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    out, lse = _attend_batched(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), scale=scale, causal=causal,
                               window=window_size, softcap=softcap, alibi=alibi_slopes, dropout_p=dropout_p,
                               lq_len=lq_len, lk_len=lk_len)
    out = out.transpose(1, 2)
    packed = torch.cat([out[i, :n] for i, _, n in rows_q]).to(q.dtype)
    if not return_attn_probs:
        return packed
    lse_packed = torch.cat([lse[i, :, :n] for i, _, n in rows_q], dim=1).float()
    return packed, lse_packed, None


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    if rotary_cos is not None or cache_leftpad is not None:
        raise NotImplementedError("rotary and cache_leftpad")
    b, lq, hq, d = q.shape
    seqlens = torch.as_tensor(cache_seqlens if cache_seqlens is not None else k_cache.shape[1]).expand(b).long()
    n = 0 if k is None else k.shape[1]
    if block_table is not None:
        page = k_cache.shape[1]
        flat_k = k_cache.view(-1, *k_cache.shape[2:])           # (num_blocks * page, H, D): a view, writes land
        flat_v = v_cache.view(-1, *v_cache.shape[2:])

        def where(i, pos):
            return block_table[i].long()[pos // page] * page + pos % page
    else:
        rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(b)
        cap = k_cache.shape[1]
        flat_k = k_cache.view(-1, *k_cache.shape[2:])
        flat_v = v_cache.view(-1, *v_cache.shape[2:])

        def where(i, pos):
            return rows[i] * cap + pos
    total = seqlens + n
    if n:
        for i in range(b):
            pos = where(i, torch.arange(int(seqlens[i]), int(seqlens[i]) + n))
            flat_k[pos] = k[i]
            flat_v[pos] = v[i]
    mk = max(int(total.max()), 1)
    t = _ct(q.dtype)
    kp = q.new_zeros((b, mk) + k_cache.shape[2:], dtype=t)
    vp = q.new_zeros((b, mk) + v_cache.shape[2:], dtype=t)
    for i in range(b):
        pos = where(i, torch.arange(int(total[i])))
        kp[i, : int(total[i])] = flat_k[pos].to(t)
        vp[i, : int(total[i])] = flat_v[pos].to(t)
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    out, lse = _attend_batched(q.transpose(1, 2).to(t), kp.transpose(1, 2), vp.transpose(1, 2), scale=scale,
                               causal=causal, window=window_size, softcap=softcap, alibi=alibi_slopes, dropout_p=0.0,
                               lq_len=torch.full((b,), lq), lk_len=total)
    out = out.transpose(1, 2).to(q.dtype)
    return (out, lse.float()) if return_softmax_lse else out
