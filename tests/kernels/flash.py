"""Honest pure-torch kernels in the flash-attention and FlashInfer calling conventions.

These are the controls of the convention catalogue (tests/test_catalogue_conventions.py):
each follows its upstream convention exactly (adapters/conventions/*.py says what
that is, with the upstream files), computes in float32 for float16/bfloat16 (float64
for float64) and returns the input dtype. `flash_attn_func` and
`flash_attn_varlen_func` are differentiable through autograd; the KV-cache and
FlashInfer entry points are forward only, as upstream.

| name | convention |
|---|---|
| `flash_attn_func` | flash_attn |
| `flash_attn_varlen_func` | flash_attn_varlen |
| `flash_attn_with_kvcache` | flash_attn_kvcache |
| `single_prefill_with_kv_cache` | flashinfer_prefill |
| `single_decode_with_kv_cache` | flashinfer_decode |
| `flash_attn_func_half` | flash_attn, declares float16/bfloat16 forward only |
| `flash_attn_func_half_undeclared` | the same kernel without the declaration (must not pass) |

The computation is one per-sequence core, `attend`, built from small stages
(`Stages`); `tests.kernels.flash_buggy` builds copies with exactly one stage
replaced by a defective one, through the same factories (`make_*`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

LOG2E = 1.0 / math.log(2.0)


# ---- the stages -------------------------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def group_contiguous(x: torch.Tensor, hq: int) -> torch.Tensor:
    """(Hkv, L, D) -> (Hq, L, D): query head h uses KV head h // (Hq / Hkv) (contiguous groups)."""
    return x.repeat_interleave(hq // x.shape[0], dim=0)


def scaled_logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return scale * (q @ k.transpose(-2, -1))


def soft_cap(s: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(s / cap); cap <= 0 or None = off."""
    return s if not cap or cap <= 0 else cap * torch.tanh(s / cap)


def alibi_bias(slopes: torch.Tensor, lq: int, lk: int, offset: int) -> torch.Tensor:
    """(Hq, Lq, Lk): -slope * |i + offset - j| with offset = Lk - Lq (bottom-right)."""
    i = torch.arange(lq, device=slopes.device)[:, None] + offset
    j = torch.arange(lk, device=slopes.device)[None, :]
    return -slopes[:, None, None] * (i - j).abs().to(slopes.dtype)


def visible(lq: int, lk: int, causal: bool, window: tuple[int, int], offset: int, device) -> torch.Tensor:
    """(Lq, Lk) bool: i + offset - left <= j <= i + offset + right (inclusive, -1 unbounded); causal sets right = 0."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(lq, device=device)[:, None] + offset
    j = torch.arange(lk, device=device)[None, :]
    vis = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def scores(q, k, scale, cap, slopes, vis, offset, st: "Stages") -> torch.Tensor:
    """Scaled logits, softcapped, plus ALiBi, then -inf where not visible (the spec's order)."""
    s = st.softcap(st.logits(q, k, scale), cap)
    if slopes is not None:
        s = s + st.alibi(slopes.to(s.dtype), q.shape[-2], k.shape[-2], offset)
    return torch.where(vis, s, -math.inf)


def masked_softmax(s: torch.Tensor, vis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, natural-log lse): rows with no visible key get weight 0 and lse -inf. Like a fused
    kernel, it knows the mask only through the -inf scores (`vis` is not consulted)."""
    vis = ~torch.isneginf(s)
    m = s.amax(dim=-1, keepdim=True).detach() if s.shape[-1] else torch.full((*s.shape[:-1], 1), -math.inf,
                                                                            dtype=s.dtype, device=s.device)
    m = torch.where(torch.isneginf(m), 0.0, m)
    p = torch.where(vis, torch.exp(s - m), 0.0)
    l = p.sum(dim=-1, keepdim=True)
    w = p / torch.where(l == 0, 1.0, l)
    lse = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(torch.where(l > 0, l, 1.0))[..., 0], -math.inf)
    return w, lse


def dropout(w: torch.Tensor, p: float) -> torch.Tensor:
    if not p:
        return w
    keep = torch.rand_like(w) >= p
    return torch.where(keep, w / (1.0 - p), 0.0)


def flash_empty_lse(lse: torch.Tensor) -> torch.Tensor:
    """flash-attention marks a row that sees no key with lse = +inf (softmax.h)."""
    return torch.where(torch.isneginf(lse), math.inf, lse)


def natural_to_base2(lse: torch.Tensor) -> torch.Tensor:
    """FlashInfer's lse is base 2 (its -inf for an empty row stays -inf)."""
    return lse * LOG2E


@dataclass(frozen=True)
class Stages:
    group: Callable = group_contiguous
    logits: Callable = scaled_logits
    softcap: Callable = soft_cap
    alibi: Callable = alibi_bias
    visible: Callable = visible
    scores: Callable = scores
    softmax: Callable = masked_softmax
    dropout: Callable = dropout
    pv: Callable = lambda w, v, s: w @ v                            # noqa: E731 (weights times values; s: the scores)
    flash_lse: Callable = flash_empty_lse
    flashinfer_lse: Callable = natural_to_base2
    offset: Callable = lambda lq, lk, max_lq, max_lk: lk - lq      # noqa: E731 (bottom-right, per sequence)
    keys_read: Callable = lambda total, new: total                  # noqa: E731 (how many cached keys are read)
    key_span: Callable = lambda cu, i, max_k: (cu[i], cu[i + 1])    # noqa: E731 (a packed sequence's keys)
    append_at: Callable = lambda seqlen: seqlen                     # noqa: E731 (where new keys are written)
    block_of: Callable = lambda table, b, t, page: table[b, t // page]  # noqa: E731 (physical block of slot t)


STAGES = Stages()


def attend(q, k, v, *, scale, causal=False, window=(-1, -1), cap=0.0, slopes=None, dropout_p=0.0,
           offset=None, st: Stages = STAGES):
    """One sequence: q (Hq, Lq, D), k (Hkv, Lk, D), v (Hkv, Lk, Dv) in the compute dtype.
    Returns (out (Hq, Lq, Dv), natural lse (Hq, Lq) with -inf for empty rows, weights)."""
    hq, lq, lk = q.shape[0], q.shape[1], k.shape[1]
    k, v = st.group(k, hq), st.group(v, hq)
    off = lk - lq if offset is None else offset
    vis = st.visible(lq, lk, causal, window, off, q.device)
    s = st.scores(q, k, scale, cap, slopes, vis, off, st)
    w, lse = st.softmax(s, vis)
    w = st.dropout(w, dropout_p)
    out = st.pv(w, v, s) if lk else torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    return out, lse, w


def _scale(q: torch.Tensor, softmax_scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _slopes(alibi_slopes, b: int, t: torch.dtype):
    if alibi_slopes is None:
        return None
    return (alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes).to(t)


def _check_heads(hq: int, hk: int, what: str) -> None:
    if hk == 0 or hq % hk:
        raise ValueError(f"{what}: number of heads in key/value ({hk}) must divide the number of query heads ({hq})")


# ---- flash_attn -----------------------------------------------------------------------------
def make_flash_attn_func(st: Stages = STAGES, name: str = "flash_attn_func"):
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
        """flash_attn_func in pure torch: (B, L, H, D), bottom-right causal/window, softcap, ALiBi, dropout."""
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(f"expected (B, L, H, D) tensors; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        (b, _, hq, d), (bk, lk, hk, dk), (bv, lv, hv, _) = q.shape, k.shape, v.shape
        if not b == bk == bv or d != dk or (lk, hk) != (lv, hv):
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        _check_heads(hq, hk, "flash_attn_func")
        t = compute_dtype(q.dtype)
        scale = _scale(q, softmax_scale)
        outs, lses, probs = [], [], []
        for i in range(b):
            o, lse, w = attend(q[i].transpose(0, 1).to(t), k[i].transpose(0, 1).to(t), v[i].transpose(0, 1).to(t),
                               scale=scale, causal=causal, window=tuple(window_size), cap=softcap,
                               slopes=_slopes(alibi_slopes, i, t), dropout_p=dropout_p, st=st)
            outs.append(o.transpose(0, 1))
            lses.append(lse)
            probs.append(w)
        out = torch.stack(outs).to(q.dtype)
        if not return_attn_probs:
            return out
        return out, st.flash_lse(torch.stack(lses).float()), torch.stack(probs)
    flash_attn_func.__name__ = flash_attn_func.__qualname__ = name
    return flash_attn_func


# ---- flash_attn_varlen ----------------------------------------------------------------------
def _cu(cu: torch.Tensor, what: str, total: int) -> list[int]:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(f"{what} must be a 1-D torch.int32 tensor")
    c = cu.tolist()
    if c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] > total:   # rows past c[-1]: padding
        raise ValueError(f"{what} must rise from 0 to at most {total}; got {c}")
    return c


def make_flash_attn_varlen_func(st: Stages = STAGES, name: str = "flash_attn_varlen_func"):
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        """flash_attn_varlen_func in pure torch: packed (total, H, D), per-sequence bottom-right alignment."""
        if block_table is not None:
            raise NotImplementedError("paged varlen (block_table) is outside this kernel")
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            raise ValueError(f"expected packed (total, H, D) tensors; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[2] != k.shape[2] or k.shape[:2] != v.shape[:2]:
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        _check_heads(q.shape[1], k.shape[1], "flash_attn_varlen_func")
        cq, ck = _cu(cu_seqlens_q, "cu_seqlens_q", q.shape[0]), _cu(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
        if len(cq) != len(ck):
            raise ValueError(f"cu_seqlens_q has {len(cq)} entries and cu_seqlens_k {len(ck)}")
        lens_q = [b - a for a, b in zip(cq, cq[1:])]
        lens_k = [b - a for a, b in zip(ck, ck[1:])]
        if max(lens_q, default=0) > max_seqlen_q or max(lens_k, default=0) > max_seqlen_k:
            raise ValueError(f"max_seqlen_q/k ({max_seqlen_q}, {max_seqlen_k}) below the longest sequence "
                             f"({max(lens_q, default=0)}, {max(lens_k, default=0)})")
        t = compute_dtype(q.dtype)
        scale = _scale(q, softmax_scale)
        hq, dv = q.shape[1], v.shape[2]
        outs, lses = [], []
        for i in range(len(cq) - 1):
            qs = q[cq[i]:cq[i + 1]].transpose(0, 1).to(t)
            k0, k1 = st.key_span(ck, i, max_seqlen_k)
            ks = k[k0:k1].transpose(0, 1).to(t)
            vs = v[k0:k1].transpose(0, 1).to(t)
            off = st.offset(lens_q[i], lens_k[i], max_seqlen_q, max_seqlen_k)
            o, lse, _ = attend(qs, ks, vs, scale=scale, causal=causal, window=tuple(window_size), cap=softcap,
                               slopes=_slopes(alibi_slopes, i, t), dropout_p=dropout_p, offset=off, st=st)
            outs.append(o.transpose(0, 1))
            lses.append(lse)
        out = torch.cat(outs) if outs else q.new_zeros((0, hq, dv), dtype=t)
        out = out.to(q.dtype)
        if not return_attn_probs:
            return out
        lse = torch.cat(lses, dim=1) if lses else q.new_zeros((hq, 0), dtype=t)
        return out, st.flash_lse(lse.float()), None
    flash_attn_varlen_func.__name__ = flash_attn_varlen_func.__qualname__ = name
    return flash_attn_varlen_func


# ---- flash_attn_with_kvcache --------------------------------------------------------------
def make_flash_attn_with_kvcache(st: Stages = STAGES, name: str = "flash_attn_with_kvcache"):
    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
        """flash_attn_with_kvcache in pure torch: contiguous or paged cache, in-place append, forward only."""
        if rotary_cos is not None or rotary_sin is not None:
            raise NotImplementedError("rotary embedding is outside this kernel")
        if (k is None) != (v is None):
            raise ValueError("k and v must be given together")
        b, lq, hq, d = q.shape
        paged = block_table is not None
        if paged and cache_batch_idx is not None:
            raise ValueError("a paged KV cache does not take cache_batch_idx")
        page = k_cache.shape[1] if paged else None
        capacity = block_table.shape[1] * page if paged else k_cache.shape[1]
        if k_cache.shape[2:3] != v_cache.shape[2:3] or k_cache.shape[3] != d:
            raise ValueError(f"cache shapes {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not fit q {tuple(q.shape)}")
        _check_heads(hq, k_cache.shape[2], "flash_attn_with_kvcache")
        if cache_seqlens is None:
            seqlens = [capacity] * b
        elif isinstance(cache_seqlens, int):
            seqlens = [cache_seqlens] * b
        else:
            seqlens = [int(x) for x in cache_seqlens.tolist()]
        rows = list(range(b)) if cache_batch_idx is None else [int(x) for x in cache_batch_idx.tolist()]
        pads = [0] * b if cache_leftpad is None else [int(x) for x in cache_leftpad.tolist()]
        n_new = 0 if k is None else k.shape[1]

        def slots(bi: int, pos: torch.Tensor):
            """(cache rows or physical blocks, offsets) of sequence bi's logical positions `pos`."""
            if paged:
                return st.block_of(block_table.long(), bi, pos, page), pos % page
            return torch.full_like(pos, rows[bi]), pos

        with torch.no_grad():
            for bi in range(b):
                at = st.append_at(seqlens[bi])
                if at + n_new > capacity:
                    raise ValueError(f"sequence {bi}: {seqlens[bi]} cached + {n_new} new keys exceed the cache ({capacity})")
                if n_new:
                    r, c = slots(bi, torch.arange(at, at + n_new))
                    k_cache[r, c] = k[bi]
                    v_cache[r, c] = v[bi]
        t = compute_dtype(q.dtype)
        scale = _scale(q, softmax_scale)
        outs, lses = [], []
        for bi in range(b):
            n = st.keys_read(seqlens[bi] + n_new, n_new)
            r, c = slots(bi, torch.arange(pads[bi], max(n, pads[bi])))
            ks = k_cache[r, c].transpose(0, 1).to(t)         # (Hkv, n, D)
            vs = v_cache[r, c].transpose(0, 1).to(t)
            o, lse, _ = attend(q[bi].transpose(0, 1).to(t), ks, vs, scale=scale, causal=causal,
                               window=tuple(window_size), cap=softcap, slopes=_slopes(alibi_slopes, bi, t), st=st)
            outs.append(o.transpose(0, 1))
            lses.append(lse)
        out = torch.stack(outs).to(q.dtype)
        if not return_softmax_lse:
            return out
        return out, st.flash_lse(torch.stack(lses).float())
    flash_attn_with_kvcache.__name__ = flash_attn_with_kvcache.__qualname__ = name
    return flash_attn_with_kvcache


# ---- FlashInfer ------------------------------------------------------------------------------
def _nhd(x: torch.Tensor, kv_layout: str) -> torch.Tensor:
    if kv_layout == "NHD":
        return x
    if kv_layout == "HND":
        return x.transpose(0, 1)
    raise ValueError(f"kv_layout must be NHD or HND; got {kv_layout!r}")


def _flashinfer_window(window_left: int, causal: bool) -> tuple[tuple[int, int], bool]:
    return (int(window_left), -1), bool(causal)


def make_single_prefill_with_kv_cache(st: Stages = STAGES, name: str = "single_prefill_with_kv_cache"):
    def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                     custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD",
                                     pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
                                     window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                     backend="auto", return_lse=False):
        """single_prefill_with_kv_cache in pure torch: q [Lq, Hq, D], k/v NHD or HND, base-2 lse."""
        if pos_encoding_mode != "NONE" or packed_custom_mask is not None:
            raise NotImplementedError("only pos_encoding_mode='NONE' and an unpacked custom_mask")
        kk, vv = _nhd(k, kv_layout), _nhd(v, kv_layout)
        lq, hq, d = q.shape
        lk, hk, dk = kk.shape
        if dk != d or vv.shape[:2] != kk.shape[:2]:
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        _check_heads(hq, hk, "single_prefill_with_kv_cache")
        t = compute_dtype(q.dtype)
        qq, k_, v_ = q.transpose(0, 1).to(t), kk.transpose(0, 1).to(t), vv.transpose(0, 1).to(t)
        cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
        window, is_causal = _flashinfer_window(window_left, causal)
        if custom_mask is not None:   # the custom mask replaces causal; the window still applies
            if tuple(custom_mask.shape) != (lq, lk):
                raise ValueError(f"custom_mask must be [qo_len, kv_len] = {(lq, lk)}; got {tuple(custom_mask.shape)}")
            vis = st.visible(lq, lk, False, window, lk - lq, q.device) & custom_mask.bool()
        else:
            vis = st.visible(lq, lk, is_causal, window, lk - lq, q.device)
        k_, v_ = st.group(k_, hq), st.group(v_, hq)
        s = st.scores(qq, k_, _scale(q, sm_scale), cap, None, vis, lk - lq, st)
        w, lse = st.softmax(s, vis)
        out = (w @ v_ if lk else torch.zeros((hq, lq, v_.shape[-1]), dtype=t)).transpose(0, 1)
        out = out.to(q.dtype if o_dtype is None else o_dtype)
        if not return_lse:
            return out
        return out, st.flashinfer_lse(lse.float()).transpose(0, 1).contiguous()
    single_prefill_with_kv_cache.__name__ = single_prefill_with_kv_cache.__qualname__ = name
    return single_prefill_with_kv_cache


def make_single_decode_with_kv_cache(st: Stages = STAGES, name: str = "single_decode_with_kv_cache"):
    prefill = make_single_prefill_with_kv_cache(st)

    def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                    q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                                    sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False):
        """single_decode_with_kv_cache in pure torch: q [Hq, D], one query at the end of the keys."""
        if q.dim() != 2:
            raise ValueError(f"decode takes q [num_qo_heads, head_dim]; got {tuple(q.shape)}")
        kk = _nhd(k, kv_layout)
        n = st.keys_read(kk.shape[0], 0)
        kk, vv = kk[:n], _nhd(v, kv_layout)[:n]
        ret = prefill(q[None], kk, vv, kv_layout="NHD", pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                      window_left=window_left, logits_soft_cap=logits_soft_cap, return_lse=return_lse)
        if not return_lse:
            return ret[0]
        return ret[0][0], ret[1][0]
    single_decode_with_kv_cache.__name__ = single_decode_with_kv_cache.__qualname__ = name
    return single_decode_with_kv_cache


flash_attn_func = make_flash_attn_func()
flash_attn_varlen_func = make_flash_attn_varlen_func()
flash_attn_with_kvcache = make_flash_attn_with_kvcache()
single_prefill_with_kv_cache = make_single_prefill_with_kv_cache()
single_decode_with_kv_cache = make_single_decode_with_kv_cache()


# ---- a forward-only half-precision kernel, with and without its declaration -------------------
def _half_only(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only supports fp16 and bf16 data type")
    with torch.no_grad():   # no backward, like a forward-only fused kernel
        return flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                               window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                               return_attn_probs=return_attn_probs)


def flash_attn_func_half(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                         softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Forward only, float16/bfloat16 only; raises on other dtypes, returns no autograd graph."""
    return _half_only(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      return_attn_probs)


flash_attn_func_half.attnconf_capabilities = {"dtypes": ["float16", "bfloat16"], "grads": False}


def flash_attn_func_half_undeclared(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """`flash_attn_func_half` without its declaration: certified for the full convention, it must fail."""
    return _half_only(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      return_attn_probs)


def replace(**stages) -> Stages:
    """STAGES with some stages replaced (the buggy catalogue's one defect each)."""
    return dataclasses.replace(STAGES, **stages)
