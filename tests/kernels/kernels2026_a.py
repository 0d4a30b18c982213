"""Catalogue for the 2026 conventions `flash_attn3`, `flash_attn4` and `sageattn` (torch, CPU).

Each kernel has exactly the upstream signature of its convention (adapters/conventions/flash_attn3.py,
flash_attn4.py, sageattn.py). The controls compute in float32 what the spec says; the sageattn control
is an emulation of SageAttention's Triton path (int8 per block of 128 queries / 64 keys, Q pre-scaled
by sm_scale * log2 e, smooth-K, float16 P and V), so the suite holds it to its accuracy contract
(SPEC section 29). Every other kernel carries one defect of a kind real bug reports show, and names
the clause that must catch it (`BUGS[name] = (convention, clause)`); tests/test_catalogue_2026_a.py
checks each one differs on a witness case and that the suite ends NONCONFORMANT on it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

LOG2E = 1.44269504
CONTROLS: dict[str, str] = {}                     # name -> convention
BUGS: dict[str, tuple[str, str]] = {}             # name -> (convention, clause)


def _visible(lq: int, lk: int, *, causal: bool, window, chunk: int, top_left_chunk: bool = False,
             chunk_extra: int = 0, causal_top_left: bool = False, chunk_ignores_causal: bool = False) -> torch.Tensor:
    """(Lq, Lk) bool: the bottom-right causal / window / chunk visibility (the spec's, unless a defect asks)."""
    i = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    vis = torch.ones(lq, lk, dtype=torch.bool)
    if causal and not (chunk and chunk_ignores_causal):
        vis &= j <= (i - (lk - lq) if causal_top_left else i)
    left, right = window
    if left is not None and left >= 0:
        vis &= j >= i - left
    if right is not None and right >= 0:
        vis &= j <= i + right
    if chunk:
        p = i - (lk - lq) if top_left_chunk else i
        start = torch.div(p, chunk, rounding_mode="floor") * chunk
        vis &= (j >= start) & (j <= start + chunk - 1 + chunk_extra)
    return vis


def _attend(q, k, v, *, scale, vis, softcap=0.0, sink=None, softcap_after_mask=False, sink_in_lse=True,
            sink_scaled=False, empty_lse=float("-inf")):
    """(out (B, Lq, H, Dv) float32, lse (B, H, Lq) float32) of q (B, Lq, Hq, D), k, v (B, Lk, Hkv, D)."""
    hq, hkv = q.shape[2], k.shape[2]
    k, v = (t.float().repeat_interleave(hq // hkv, dim=2) for t in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q.float(), k) * scale
    if softcap and not softcap_after_mask:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~vis, float("-inf"))
    if softcap and softcap_after_mask:
        s = softcap * torch.tanh(s / softcap)
    m = s.amax(dim=-1)
    sk = None
    if sink is not None:
        sk = sink.float()[None, :, None] * (scale if sink_scaled else 1.0)
        m = torch.maximum(m, sk)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe[..., None])
    den = p.sum(-1)
    total = den + (torch.exp(sk - m_safe) if sk is not None else 0.0)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = torch.einsum("bhij,bjhd->bihd", p / safe[..., None], v)
    norm = total if sink_in_lse else den
    lse = torch.where(norm > 0, m_safe + torch.log(torch.where(norm > 0, norm, torch.ones_like(norm))),
                      torch.full_like(norm, empty_lse))
    return out, lse


def _register(table: dict, name: str, value: Any, caps: dict | None, fn: Callable) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    if caps is not None:
        fn.attnconf_capabilities = caps
    if isinstance(value, tuple):                      # a one-defect kernel: what tests/kernels/by_clause.py reads
        fn.convention, fn.clause = value
    table[name] = value
    globals()[name] = fn
    return fn


# ---- flash_attn3 -----------------------------------------------------------------------------------
def _fa3(name: str, clause: str | None, caps: dict | None = None, **defect) -> Callable:
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                        v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
        fp8 = q.dtype == torch.float8_e4m3fn
        out_dtype = torch.bfloat16 if fp8 else q.dtype
        if fp8:
            hq, hkv = q.shape[2], k.shape[2]
            per = (lambda d: d[:1, :1].expand_as(d)) if defect.get("descale_per_tensor") else (lambda d: d)
            q = q.float() * per(q_descale).repeat_interleave(hq // hkv, dim=1)[:, None, :, None]
            k = k.float() * per(k_descale)[:, None, :, None]
            v = v.float() * per(v_descale)[:, None, :, None]
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        vis = _visible(q.shape[1], k.shape[1], causal=causal, window=window_size, chunk=attention_chunk,
                       top_left_chunk=defect.get("top_left_chunk", False), chunk_extra=defect.get("chunk_extra", 0),
                       causal_top_left=defect.get("causal_top_left", False),
                       chunk_ignores_causal=defect.get("chunk_ignores_causal", False))
        out, lse = _attend(q, k, v, scale=scale, vis=vis, softcap=softcap,
                           softcap_after_mask=defect.get("softcap_after_mask", False),
                           empty_lse=defect.get("empty_lse", float("-inf")))
        out = out.to(out_dtype)
        return (out, lse) if return_attn_probs else out
    return _register(BUGS if clause else CONTROLS, name, ("flash_attn3", clause) if clause else "flash_attn3", caps,
                     flash_attn_func)


_fa3("fa3_flash_attn_func", None)
_fa3("fa3_chunk_off_by_one", "ATTN-CHUNK-1", chunk_extra=1)
_fa3("fa3_chunk_top_left", "ATTN-CHUNK-1", top_left_chunk=True)
_fa3("fa3_causal_window_misaligned", "ATTN-CAUSAL-1", causal_top_left=True)
_fa3("fa3_chunk_ignores_causal", "ATTN-CHUNK-2", chunk_ignores_causal=True)   # the chunk replaces causal
_fa3("fa3_softcap_after_mask", "ATTN-CAP-1", softcap_after_mask=True)
_fa3("fa3_lse_empty_plus_inf", "ATTN-LSE-2", empty_lse=float("inf"))
FP8 = {"dtypes": ["bfloat16"], "grads": False, "quantization": {"scheme": "fp8_e4m3_per_head"},
       "features": ["gqa", "custom_scale", "cross", "lse"]}
_fa3("fa3_fp8", None, FP8)
_fa3("fa3_fp8_descale_per_tensor", "ATTN-QUANT-1", FP8, descale_per_tensor=True)


# ---- flash_attn4 -----------------------------------------------------------------------------------
def _fa4(name: str, clause: str | None, **defect) -> Callable:
    def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                        window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                        deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                        aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        window = tuple(-1 if w is None else w for w in window_size)
        vis = _visible(q.shape[1], k.shape[1], causal=causal, window=window, chunk=0)
        out, lse = _attend(q, k, v, scale=scale, vis=vis, softcap=softcap, sink=learnable_sink,
                           sink_in_lse=not defect.get("sink_not_in_lse", False),
                           sink_scaled=defect.get("sink_scaled", False))
        return out.to(q.dtype), (lse if return_lse else None)
    return _register(BUGS if clause else CONTROLS, name, ("flash_attn4", clause) if clause else "flash_attn4", None,
                     flash_attn_func)


_fa4("fa4_flash_attn_func", None)
_fa4("fa4_sink_missing_from_lse", "ATTN-SINK-2", sink_not_in_lse=True)
_fa4("fa4_sink_scaled", "ATTN-SINK-1", sink_scaled=True)


# ---- sageattn ------------------------------------------------------------------------------------------
def _int8_per_block(x: torch.Tensor, block: int, pre: float, *, truncate: bool = False):
    """(int8 values as float32, per-block float32 scale broadcast to x) of x (B, H, L, D)."""
    B, H, L, D = x.shape
    nb = -(-L // block)
    xs = torch.zeros(B, H, nb * block, D)
    xs[:, :, :L] = x.float() * torch.tensor(pre, dtype=torch.float32)
    blocks = xs.reshape(B, H, nb, block, D)
    scale = blocks.abs().amax(dim=(3, 4), keepdim=True) / 127.0
    y = blocks / torch.where(scale > 0, scale, torch.ones_like(scale))
    if not truncate:
        y = y + 0.5 * torch.where(y >= 0, 1.0, -1.0)
    ints = y.to(torch.int8).float()
    full = scale.expand_as(blocks)
    return ints.reshape(B, H, -1, D)[:, :, :L], full.reshape(B, H, -1, D)[:, :, :L]


def _sage(name: str, clause: str | None, caps: dict | None, **defect) -> Callable:
    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
        if tensor_layout == "NHD":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dtype = q.dtype
        if smooth_k and not defect.get("ignore_smooth_k"):
            k = k - k.mean(dim=2, keepdim=True)
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        qi, qs = _int8_per_block(q, defect.get("q_block", 128), scale * LOG2E, truncate=defect.get("truncate", False))
        ki, ks = _int8_per_block(k, 64, 1.0, truncate=defect.get("truncate", False))
        hq, hkv = q.shape[1], k.shape[1]
        group = (lambda t: t.repeat(1, hq // hkv, 1, 1)) if defect.get("gqa_modulo") else \
            (lambda t: t.repeat_interleave(hq // hkv, dim=1))
        ki, ks, vv = group(ki), group(ks), group(v.to(torch.float16))
        s2 = (qi * qs) @ (ki * ks).transpose(-1, -2)          # base-2 logits; int8 products are exact in float32
        lq, lk = s2.shape[-2:]
        if defect.get("tail_keys_zero") and lk % 64:        # SageAttention 1.0.6: the last block's padding keys
            s2 = torch.cat([s2, torch.zeros(*s2.shape[:-1], 64 - lk % 64)], dim=-1)
            vv = torch.cat([vv, torch.zeros(*vv.shape[:2], 64 - lk % 64, vv.shape[-1], dtype=vv.dtype)], dim=2)
        if is_causal:
            j = torch.arange(s2.shape[-1])[None, :]
            s2 = s2.masked_fill(j > torch.arange(lq)[:, None], float("-inf"))
        m = s2.amax(-1, keepdim=True)
        p = torch.exp2(s2 - m)
        out = (p.to(torch.float16).float() @ vv.float()) / p.sum(-1, keepdim=True)
        out = out.to(dtype)
        return out.transpose(1, 2) if tensor_layout == "NHD" else out
    return _register(BUGS if clause else CONTROLS, name, ("sageattn", clause) if clause else "sageattn", caps, sageattn)


SAGE = {"features": ["gqa", "custom_scale", "cross", "noncontiguous"]}
_sage("sage_sageattn", None, SAGE)
_sage("sage_accuracy_class", None, {**SAGE, "accuracy": {"cosine": 0.99, "rel_l1": 0.1}})
_sage("sage_ignores_smooth_k", "ATTN-QUANT-3", SAGE, ignore_smooth_k=True)
_sage("sage_truncating_int8", "ATTN-QUANT-3", SAGE, truncate=True)
_sage("sage_q_block_64", "ATTN-QUANT-3", SAGE, q_block=64)
_sage("sage_kv_tail_unmasked", "ATTN-QUANT-3", SAGE, tail_keys_zero=True)
_sage("sage_gqa_modulo", "ATTN-QUANT-3", SAGE, gqa_modulo=True)
_sage("sage_accuracy_class_gqa_modulo", "ATTN-QUANT-2", {**SAGE, "accuracy": {"cosine": 0.99, "rel_l1": 0.1}},
      gqa_modulo=True)
# the control itself, declared causal: smooth-K and per-block K scales read keys past the cutoff
_sage("sage_causal", "ATTN-CAUSAL-2", {"features": ["causal_bottom_right", "gqa", "custom_scale", "noncontiguous"]})

KERNELS: dict[str, Callable] = {n: globals()[n] for n in (*CONTROLS, *BUGS)}
