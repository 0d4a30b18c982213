"""Pure-torch kernels in the 2026 conventions of issue 26 (part b): FlashMLA dense decode and sparse
prefill, FlashInfer's paged batch prefill and decode wrappers; correct controls and one-defect copies.

Each kernel follows its upstream convention as `adapters/conventions/<name>.py` states it,
computes in float32 for float16/bfloat16 (float64 for float64) and returns the input dtype.
A kernel is built by a factory from a `Defects` value: the controls have none, each catalogue
kernel exactly one, of a kind real bug reports show (`BUGS`: name -> kernel, with `.clause`
and `.convention`). tests/test_catalogue_2026_b.py shows each defect on a witness case and
runs the suite on a few of them.

| control | convention |
|---|---|
| `flash_mla_with_kvcache` (+ `get_mla_metadata`) | flashmla_kvcache |
| `flash_mla_sparse_fwd` | flashmla_sparse |
| `BatchPrefillWithPagedKVCacheWrapper` | flashinfer_batch_prefill |
| `BatchDecodeWithPagedKVCacheWrapper` | flashinfer_batch_decode |
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Defects:
    v_slice_end: bool = False          # V read as the last head_dim_v dims of the latent (rope dims in V)
    score_without_rope: bool = False   # scores from the first head_dim_v dims only
    mla_empty_lse_neg_inf: bool = False
    last_page_full: bool = False       # the last page read whole, ignoring the sequence length
    negative_index_wraps: bool = False  # -1 read as kv[-1]
    duplicates_twice: bool = False
    out_of_range_clamped: bool = False  # an index >= s_kv read as the last row
    sparse_lse_base2: bool = False
    max_logits_unscaled: bool = False
    page_size_16: bool = False         # page length taken as 16 whatever plan said
    softcap_after_mask: bool = False
    next_page_read: bool = False       # one page past the request's slice of the page table
    hnd_read_as_nhd: bool = False


# ---- shared core -----------------------------------------------------------------------------
def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def softmax_rows(s: torch.Tensor, keep: torch.Tensor, v: torch.Tensor):
    """(out, natural lse, max) of rows of logits s (..., Lk) over keep; a row with none: out 0, lse -inf."""
    s = s.masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1) if s.shape[-1] else s.new_full(s.shape[:-1], -math.inf)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe[..., None])
    d = p.sum(dim=-1)
    out = (p @ v) / torch.where(d > 0, d, torch.ones_like(d))[..., None]
    lse = torch.where(d > 0, m_safe + torch.log(torch.where(d > 0, d, torch.ones_like(d))), torch.full_like(d, -math.inf))
    return out, lse, m


# ---- FlashMLA dense decode --------------------------------------------------------------------
def get_mla_metadata(*args: Any, **kwargs: Any):
    """As the current FlashMLA: an opaque scheduling object (here a dict) and None."""
    return {"planned": True}, None


def make_mla_kvcache(defects: Defects = Defects()) -> Callable[..., Any]:
    def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor],
                               cache_seqlens: Optional[torch.Tensor], head_dim_v: int, tile_scheduler_metadata: Any,
                               num_splits: None = None, softmax_scale: Optional[float] = None, causal: bool = False,
                               is_fp8_kvcache: bool = False, indices=None, attn_sink=None, extra_k_cache=None,
                               extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None):
        b, s_q, h_q, d = q.shape
        page, h_kv = k_cache.shape[1], k_cache.shape[2]
        scale = d ** -0.5 if softmax_scale is None else softmax_scale
        ct = compute_dtype(q)
        out = q.new_zeros((b, s_q, h_q, head_dim_v), dtype=ct)
        lse = torch.empty((b, h_q, s_q), dtype=torch.float32)
        for i in range(b):
            n = int(cache_seqlens[i])
            pages = math.ceil(n / page)
            kv = k_cache[block_table[i, :pages].long()].reshape(-1, h_kv, d)
            kv = (kv if defects.last_page_full else kv[:n]).to(ct).transpose(0, 1)
            kv = kv.repeat_interleave(h_q // h_kv, dim=0)                       # (h_q, n, d)
            v = kv[..., d - head_dim_v:] if defects.v_slice_end else kv[..., :head_dim_v]
            qi = q[i].to(ct).transpose(0, 1)                                     # (h_q, s_q, d)
            s = (qi[..., :head_dim_v] @ kv[..., :head_dim_v].transpose(-1, -2) if defects.score_without_rope
                 else qi @ kv.transpose(-1, -2)) * scale
            keep = torch.ones(s_q, kv.shape[1], dtype=torch.bool)
            if causal:
                keep = keep.tril(diagonal=n - s_q)
            o, l, _ = softmax_rows(s, keep, v)
            out[i] = o.transpose(0, 1)
            lse[i] = l.where(torch.isfinite(l), torch.tensor(-math.inf if defects.mla_empty_lse_neg_inf else math.inf))
        return out.to(q.dtype), lse
    return flash_mla_with_kvcache


# ---- FlashMLA sparse prefill --------------------------------------------------------------------
def make_mla_sparse(defects: Defects = Defects()) -> Callable[..., Any]:
    def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                             d_v: int = 512, attn_sink: Optional[torch.Tensor] = None,
                             topk_length: Optional[torch.Tensor] = None):
        s_q, h_q, d = q.shape
        s_kv, h_kv = kv.shape[0], kv.shape[1]
        group = h_q // h_kv
        ct = compute_dtype(q)
        out = torch.zeros((s_q, h_q, d_v), dtype=ct)
        mx = torch.empty((s_q, h_q), dtype=torch.float32)
        lse = torch.empty((s_q, h_q), dtype=torch.float32)
        for g in range(h_kv):
            idx = indices[:, g].long()                                           # (s_q, topk)
            valid = (idx < s_kv) if defects.negative_index_wraps else (idx >= 0) & (idx < s_kv)
            if defects.out_of_range_clamped:
                valid = idx >= 0
                idx = idx.clamp(max=s_kv - 1)
            if not defects.duplicates_twice:                                    # a set: the first of equal indices
                same = (idx[:, :, None] == idx[:, None, :]) & valid[:, None, :]
                earlier = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril(-1)
                valid = valid & ~(same & earlier).any(dim=-1)
            rows = kv[idx.remainder(s_kv) if defects.negative_index_wraps else idx.clamp(0, s_kv - 1), g].to(ct)
            qg = q[:, g * group:(g + 1) * group].to(ct)                          # (s_q, group, d)
            s = qg @ rows.transpose(-1, -2)                                      # (s_q, group, topk)
            raw_max = s.masked_fill(~valid[:, None, :], -math.inf).amax(dim=-1)
            o, l, m = softmax_rows(s * sm_scale, valid[:, None, :].expand_as(s), rows[..., :d_v])
            if attn_sink is not None:
                sink = attn_sink[g * group:(g + 1) * group].to(ct)
                o = o * torch.where(torch.isfinite(l), torch.sigmoid(l - sink), torch.zeros_like(l))[..., None]
            out[:, g * group:(g + 1) * group] = o
            mx[:, g * group:(g + 1) * group] = (raw_max if defects.max_logits_unscaled else m).float()
            l = l * LOG2E if defects.sparse_lse_base2 else l
            lse[:, g * group:(g + 1) * group] = l.where(torch.isfinite(l), torch.tensor(math.inf)).float()
        return out.to(q.dtype), mx, lse
    return flash_mla_sparse_fwd


# ---- FlashInfer paged batch wrappers -----------------------------------------------------------
def request_kv(cache, layout: str, pages: torch.Tensor, page_size: int, last_len: int, defects: Defects):
    """(k, v) of one request, each (Hkv, kv_len, D), read through its pages."""
    k_cache, v_cache = (cache[:, 0], cache[:, 1]) if isinstance(cache, torch.Tensor) else cache
    nhd = layout == "NHD" or defects.hnd_read_as_nhd

    def gather(c: torch.Tensor) -> torch.Tensor:
        x = c[pages.long()]
        x = x if nhd else x.transpose(1, 2)                  # (pages, page, H, D)
        return x.reshape(-1, x.shape[2], x.shape[3]).transpose(0, 1)
    n_pages = int(pages.numel())
    n = 0 if n_pages == 0 else (n_pages * page_size if defects.last_page_full or defects.next_page_read
                                else (n_pages - 1) * page_size + last_len)
    if defects.page_size_16:                                  # slot of key t: page t // 16, offset t % 16
        t = torch.arange(n)
        def gather(c: torch.Tensor) -> torch.Tensor:          # noqa: F811
            flat = (c if nhd else c.transpose(1, 2)).reshape(-1, c.shape[2 if nhd else 1], c.shape[3])
            return flat[(pages.long()[t // 16] * 16 + t % 16) % flat.shape[0]].transpose(0, 1)
    return gather(k_cache)[:, :n], gather(v_cache)[:, :n]


def attend_request(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, keep: torch.Tensor,
                   cap: Optional[float], defects: Defects):
    """q (Lq, Hq, D), k/v (Hkv, L, D) -> (out (Lq, Hq, Dv), base-2 lse (Lq, Hq))."""
    ct = compute_dtype(q)
    hq = q.shape[1]
    k, v = (x.to(ct).repeat_interleave(hq // x.shape[0], dim=0) for x in (k, v))
    s = (q.to(ct).transpose(0, 1) @ k.transpose(-1, -2)) * scale
    if cap and defects.softcap_after_mask:
        s = cap * torch.tanh(s.masked_fill(~keep, -math.inf) / cap)
        keep = torch.ones_like(keep)
    elif cap:
        s = cap * torch.tanh(s / cap)
    o, l, _ = softmax_rows(s, keep.expand_as(s), v)
    return o.transpose(0, 1), (l * LOG2E).transpose(0, 1).float()


def visible(lq: int, lk: int, causal: bool, window_left: int) -> torch.Tensor:
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window_left >= 0:
        keep &= j >= i - window_left
    return keep


def make_batch_prefill(defects: Defects = Defects()) -> type:
    class BatchPrefillWithPagedKVCacheWrapper:
        def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                     **kwargs: Any) -> None:
            self.layout = kv_layout

        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
                 causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                 logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
                 **kwargs: Any) -> None:
            self.p = dict(qo=qo_indptr.tolist(), kv=paged_kv_indptr.tolist(), idx=paged_kv_indices.clone(),
                          last=paged_kv_last_page_len.tolist(), page=page_size, mask=custom_mask, causal=causal,
                          scale=head_dim_qk ** -0.5 if sm_scale is None else sm_scale, window=window_left,
                          cap=logits_soft_cap, dv=head_dim_vo or head_dim_qk)

        def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs: Any):
            p = self.p
            o_all = torch.zeros(q.shape[0], q.shape[1], p["dv"], dtype=q.dtype)
            l_all = torch.full((q.shape[0], q.shape[1]), -math.inf, dtype=torch.float32)
            mask_at = 0
            for b in range(len(p["last"])):
                lo, hi = p["kv"][b], p["kv"][b + 1] + (1 if defects.next_page_read and b + 1 < len(p["last"]) else 0)
                k, v = request_kv(paged_kv_cache, self.layout, p["idx"][lo:hi], p["page"], p["last"][b], defects)
                q0, q1 = p["qo"][b], p["qo"][b + 1]
                lq, lk = q1 - q0, k.shape[1]
                if p["mask"] is not None:
                    keep = p["mask"][mask_at:mask_at + lq * lk].reshape(lq, lk)
                    mask_at += lq * lk
                else:
                    keep = visible(lq, lk, p["causal"], p["window"])
                if p["mask"] is not None and p["window"] >= 0:
                    keep = keep & visible(lq, lk, False, p["window"])
                o, l2 = attend_request(q[q0:q1], k, v, p["scale"], keep, p["cap"], defects)
                o_all[q0:q1], l_all[q0:q1] = o.to(q.dtype), l2
            return (o_all, l_all) if return_lse else o_all
    return BatchPrefillWithPagedKVCacheWrapper


def make_batch_decode(defects: Defects = Defects()) -> type:
    class BatchDecodeWithPagedKVCacheWrapper:
        def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                     use_tensor_cores: bool = False, **kwargs: Any) -> None:
            self.layout = kv_layout

        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                 pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                 kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
                 **kwargs: Any) -> None:
            self.p = dict(kv=indptr.tolist(), idx=indices.clone(), last=last_page_len.tolist(), page=page_size,
                          scale=head_dim ** -0.5 if sm_scale is None else sm_scale, window=window_left,
                          cap=logits_soft_cap)

        def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs: Any):
            p = self.p
            o_all = torch.zeros_like(q)
            l_all = torch.full(q.shape[:2], -math.inf, dtype=torch.float32)
            for b in range(q.shape[0]):
                k, v = request_kv(paged_kv_cache, self.layout, p["idx"][p["kv"][b]:p["kv"][b + 1]], p["page"],
                                  p["last"][b], defects)
                keep = visible(1, k.shape[1], True, p["window"])
                o, l2 = attend_request(q[b:b + 1], k, v, p["scale"], keep, p["cap"], defects)
                o_all[b], l_all[b] = o[0].to(q.dtype), l2[0]
            return (o_all, l_all) if return_lse else o_all
    return BatchDecodeWithPagedKVCacheWrapper


# ---- the controls ------------------------------------------------------------------------------
flash_mla_with_kvcache = make_mla_kvcache()
flash_mla_sparse_fwd = make_mla_sparse()
BatchPrefillWithPagedKVCacheWrapper = make_batch_prefill()
BatchDecodeWithPagedKVCacheWrapper = make_batch_decode()

FACTORIES = {"flashmla_kvcache": make_mla_kvcache, "flashmla_sparse": make_mla_sparse,
             "flashinfer_batch_prefill": make_batch_prefill, "flashinfer_batch_decode": make_batch_decode}
CONTROLS = {"flash_mla_with_kvcache": "flashmla_kvcache", "flash_mla_sparse_fwd": "flashmla_sparse",
            "BatchPrefillWithPagedKVCacheWrapper": "flashinfer_batch_prefill",
            "BatchDecodeWithPagedKVCacheWrapper": "flashinfer_batch_decode"}

# ---- the catalogue: name -> (convention, clause, defect, why) ---------------------------------------
CATALOGUE = {
    "mla_v_from_latent_end": ("flashmla_kvcache", "ATTN-MLA-1", "v_slice_end",
                              "V read as the last 512 of the 576 dims, so the rope dims land in V"),
    "mla_score_without_rope": ("flashmla_kvcache", "ATTN-MLA-1", "score_without_rope",
                               "scores from the 512 latent dims only, the 64 rope dims dropped"),
    "mla_last_page_full": ("flashmla_kvcache", "ATTN-PAGED-4", "last_page_full",
                           "the last page read whole: the slots past cache_seqlens are attended"),
    "mla_empty_lse_neg_inf": ("flashmla_kvcache", "ATTN-LSE-2", "mla_empty_lse_neg_inf",
                              "an empty row's lse -inf where the convention says +inf"),
    "sparse_negative_index_wraps": ("flashmla_sparse", "ATTN-SPARSE-2", "negative_index_wraps",
                                    "-1 read with Python's negative indexing: the last kv row is attended"),
    "sparse_duplicates_twice": ("flashmla_sparse", "ATTN-SPARSE-1", "duplicates_twice",
                                "an index listed twice is counted twice in the softmax"),
    "sparse_out_of_range_clamped": ("flashmla_sparse", "ATTN-SPARSE-2", "out_of_range_clamped",
                                    "an index >= s_kv clamped to the last row instead of masked"),
    "sparse_lse_base2": ("flashmla_sparse", "ATTN-LSE-1", "sparse_lse_base2",
                         "the lse in base 2, as before FlashMLA's January 2026 change"),
    "sparse_max_logits_unscaled": ("flashmla_sparse", "ATTN-SPARSE-3", "max_logits_unscaled",
                                   "max_logits before sm_scale"),
    "prefill_page_size_16": ("flashinfer_batch_prefill", "ATTN-PAGED-4", "page_size_16",
                             "a page taken as 16 slots whatever page_size plan was given"),
    "prefill_last_page_full": ("flashinfer_batch_prefill", "ATTN-PAGED-4", "last_page_full",
                               "paged_kv_last_page_len ignored: the whole last page is attended"),
    "prefill_softcap_after_mask": ("flashinfer_batch_prefill", "ATTN-CAP-1", "softcap_after_mask",
                                   "the soft cap applied after masking: masked logits become -cap and leak"),
    "prefill_next_page_read": ("flashinfer_batch_prefill", "ATTN-PAGED-4", "next_page_read",
                               "one page past the request's slice of paged_kv_indices is read (out of bounds)"),
    "prefill_hnd_read_as_nhd": ("flashinfer_batch_prefill", "ATTN-PAGED-4", "hnd_read_as_nhd",
                                "an HND cache read as NHD"),
    "decode_last_page_full": ("flashinfer_batch_decode", "ATTN-PAGED-4", "last_page_full",
                              "last_page_len ignored: the whole last page is attended"),
    "decode_page_size_16": ("flashinfer_batch_decode", "ATTN-PAGED-4", "page_size_16",
                            "a page taken as 16 slots whatever page_size plan was given"),
    "decode_softcap_after_mask": ("flashinfer_batch_decode", "ATTN-CAP-1", "softcap_after_mask",
                                  "the soft cap applied after the window mask"),
}


def _build(name: str, conv: str, clause: str, defect: str, why: str):
    kernel = FACTORIES[conv](Defects(**{defect: True}))
    kernel.__doc__ = f"Defect ({clause}): {why}."
    kernel.clause, kernel.convention, kernel.defect = clause, conv, defect
    kernel.__qualname__ = kernel.__name__ = name
    return kernel


BUGS: dict[str, Any] = {name: _build(name, *spec) for name, spec in CATALOGUE.items()}
globals().update(BUGS)
