"""One-defect kernels that are exact except on one branch path a real template has (issue 25, item 3).

Real kernels choose a code path by shape (conformance/strategies/boundaries.py): a second query tile of a head-dim
template, the split-KV decode path with its merge of partials, GQA packing of many query heads per KV head,
batch blocking, the MLA 576/512 template. Each kernel here takes those paths the way such kernels do and
carries one defect on exactly one of them, so only a case that reaches the path can tell it from a correct
kernel; `conformance/test_branch_points.py` (the boundary x family grid of conformance/strategies/branch_cases.py) must
catch every one, naming its branch point (tests/test_branch_catalogue.py). Three calling conventions:

- the torch SDPA convention (`--backend=torch --kernel=tests.kernels.branch_bugs:NAME`): `_sdpa(defect)`,
  with `sdpa_branch_control` the same branched code without a defect;
- the numpy variant kernels (`--backend=numpy`): `variant_bugs.VariantKernel` subclasses whose forward takes
  a defect hook of `variant_bugs.variant_forward` (or a changed case) on one path; `variant_bugs.correct` is
  their control;
- flash-attention 2's `flash_attn_func` (`--backend=torch --convention=flash_attn`), built by
  `tests.kernels.flash`'s factory with one stage replaced; `flash.flash_attn_func` is their control.

`BUGS[name] = BranchBug(convention, defect, boundaries, family)`: the boundaries whose grid case in `family`
shows the defect (any boundary where the defect is not about shape). Every kernel declares its scope: the
convention's whole one (no attribute), so every other case of the suite holds it to the spec.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from attnconf.conformance.strategies.boundaries import BOUNDARIES
from attnconf.reference import Case

from . import flash, variant_bugs
from .correct import apply_masks, dropout, inputs, softmax, softmax_scale, weighted_values

SPLIT_MIN_LQ, SPLIT_MAX_LQ, SPLIT_FROM_LK = 2, 16, 1025   # the split-KV decode path: 2 <= Lq <= 16, Lk > 1024
SPLIT_CHUNK = 512                                         # keys per split
Q_TILE = 64                                               # query rows per tile of the 256 template
BWD_Q_TILE = 128                                          # query rows per tile of the backward's dQ pass
PACK = 8                                                  # query heads packed per KV head in one tile
KEY_TILE = 128                                            # keys per tile (the window's masking steps)
ANY = tuple(b.id for b in BOUNDARIES)


@dataclass(frozen=True)
class BranchBug:
    convention: str           # "sdpa", "numpy" or a convention of adapters/conventions
    defect: str               # what is wrong, on which path
    boundaries: tuple[str, ...]   # the grid's boundaries whose `family` case shows it
    family: str


BUGS: dict[str, BranchBug] = {}


def split_path(lq: int, lk: int) -> bool:
    return SPLIT_MIN_LQ <= lq <= SPLIT_MAX_LQ and lk >= SPLIT_FROM_LK


# ---- the torch SDPA convention ------------------------------------------------------------------
def _split_kv(s: torch.Tensor, vis: torch.Tensor, v: torch.Tensor, p_drop: float, merge_rescales: bool):
    """The split-KV path: each split of SPLIT_CHUNK keys gives (max, sum, unnormalised output); the merge
    rescales each by exp(max_i - max) (without it, each split's partials keep their own max)."""
    parts = []
    for j0 in range(0, s.shape[-1], SPLIT_CHUNK):
        sj, vj = s[..., j0:j0 + SPLIT_CHUNK], vis[..., j0:j0 + SPLIT_CHUNK]
        sj = torch.where(vj, sj, -math.inf)
        m = sj.amax(dim=-1, keepdim=True)
        p = torch.where(vj, torch.exp(sj - torch.where(torch.isneginf(m), 0.0, m)), 0.0)
        o = weighted_values(dropout(p, p_drop), v[..., j0:j0 + SPLIT_CHUNK, :])
        parts.append((m, p.sum(dim=-1, keepdim=True), o))
    m = torch.stack([m for m, _, _ in parts]).amax(dim=0)
    m_safe = torch.where(torch.isneginf(m), 0.0, m)
    acc, total = 0.0, 0.0
    for mi, li, oi in parts:
        w = torch.where(torch.isneginf(mi), 0.0, torch.exp(mi - m_safe)) if merge_rescales else 1.0
        acc, total = acc + w * oi, total + w * li
    return acc / torch.where(total == 0, 1.0, total)


def _forward(defect: str | None, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The branched forward: batch blocks, the split-KV path, per-template scales, packed GQA heads."""
    q, k, v = inputs(query, key, value, enable_gqa)
    if defect == "mla_v_from_latent" and q.shape[-1] == 576 and v.shape[-1] == 512:
        v = k[..., :512]                       # the absorbed-MLA template assumes V = the latent's first 512
    b, hq, lq, d = q.shape
    lk = k.shape[-2]
    block = 8 if defect == "batch_block8_short_key" else 4
    outs = []
    for b0 in range(0, b, block):
        b1 = min(b, b0 + block)
        kv0 = 0 if (defect == "batch_block_kv_stride" and b0 > 0) else b0     # K/V base not advanced past block 0
        qb, kb, vb = q[b0:b1], k[kv0:kv0 + b1 - b0], v[kv0:kv0 + b1 - b0]
        sc = softmax_scale(q, scale)
        s = sc * (qb @ kb.transpose(-2, -1))
        if defect == "d256_qtile2_scale" and d == 256 and lq > Q_TILE and scale is None:
            s[..., Q_TILE:, :] *= math.sqrt(256 / 128)   # the second query tile uses the 128 template's 1/sqrt(d)
        mb = attn_mask if attn_mask is None or attn_mask.dim() < 4 or attn_mask.shape[0] == 1 else attn_mask[b0:b1]
        s, vis = apply_masks(s, mb, is_causal)
        if defect == "batch_block8_short_key" and b0 > 0:
            vis = vis & (torch.arange(lk) < lk - 1)      # the second block's key bound is one short
        if split_path(lq, lk):
            o = _split_kv(s, vis, vb, dropout_p, merge_rescales=defect != "split_merge_unscaled")
        else:
            o = weighted_values(dropout(softmax(s, vis), dropout_p), vb)
        outs.append(o)
    out = torch.cat(outs) if outs else torch.zeros((0, hq, lq, v.shape[-1]), dtype=q.dtype)
    g = hq // key.shape[1]
    if defect == "gqa_pack_wraps" and g > PACK:
        h = torch.arange(hq)
        out = out[:, h - h % g + (h % g) % PACK]          # packed head index wraps after 8 heads per KV head
    return out


class _RecomputedBackward(torch.autograd.Function):
    """Forward as `_forward`; backward by recomputing it under the saved RNG state, then one defect on
    the gradient of one tile (the way a fused backward handles its tiles separately)."""

    @staticmethod
    def forward(ctx, defect, args, query, key, value):
        ctx.defect, ctx.args, ctx.rng = defect, args, torch.get_rng_state()
        ctx.save_for_backward(query, key, value)
        with torch.no_grad():
            return _forward(None, query, key, value, *args).to(query.dtype)

    @staticmethod
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors
        with torch.enable_grad(), torch.random.fork_rng():
            torch.set_rng_state(ctx.rng)
            leaves = [t.detach().requires_grad_() for t in (query, key, value)]
            out = _forward(None, *leaves, *ctx.args)
            g = grad.to(out.dtype)
            if ctx.defect == "bwd_d256_dkdv_first_qtile":
                dq, = torch.autograd.grad(out, leaves[:1], g, retain_graph=True)
                first = torch.zeros_like(g)
                first[..., :Q_TILE, :] = g[..., :Q_TILE, :]      # dK, dV accumulate over the first query tile only
                dk, dv = torch.autograd.grad(out, leaves[1:], first)
            else:
                dq, dk, dv = torch.autograd.grad(out, leaves, g)
                if ctx.defect == "bwd_dq_qtile2_unscaled":
                    sc = softmax_scale(query, ctx.args[3])
                    dq = dq.clone()
                    dq[..., BWD_Q_TILE:, :] /= sc               # the second tile's dQ misses its `* scale` epilogue
        return None, None, dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


def _bwd_branch(defect: str | None, query, key) -> bool:
    if defect == "bwd_dq_qtile2_unscaled":
        return query.shape[-2] > BWD_Q_TILE
    return defect == "bwd_d256_dkdv_first_qtile" and query.shape[-1] == 256 and query.shape[-2] > Q_TILE


def _sdpa(name: str, defect: str | None, boundaries: tuple[str, ...] = (), family: str = "plain",
          doc: str = "") -> Callable:
    def kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        args = (attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if query.requires_grad and _bwd_branch(defect, query, key):
            return _RecomputedBackward.apply(defect, args, query, key, value)
        return _forward(defect, query, key, value, *args).to(query.dtype)
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = doc or "The branched SDPA kernel without a defect: the control of its bugs."
    if defect is not None:
        BUGS[name] = BranchBug("sdpa", doc, boundaries, family)
    globals()[name] = kernel
    return kernel


_sdpa("sdpa_branch_control", None)
_sdpa("sdpa_d256_qtile2_scale", "d256_qtile2_scale", ("D=256,Lq>64",), "plain",
      "Defect: in the 256 head-dim template, query rows past the first tile of 64 are scaled by 1/sqrt(128).")
_sdpa("sdpa_mla_v_from_latent", "mla_v_from_latent", ("Dk=576,Dv=512",), "plain",
      "Defect: the 576/512 template reads V as the first 512 dims of K (the absorbed-MLA latent), not V.")
_sdpa("sdpa_split_merge_unscaled", "split_merge_unscaled", ("split-KV", "split-KV-2048"), "plain",
      "Defect: the split-KV merge adds each split's output and sum without the exp(max_i - max) rescale.")
_sdpa("sdpa_gqa_pack_wraps", "gqa_pack_wraps", ("group>8", "group>16", "group>64"), "gqa",
      "Defect: with more than 8 query heads per KV head, the packed head index wraps: head 8 + h returns head h.")
_sdpa("sdpa_batch_block_kv_stride", "batch_block_kv_stride", ("B>4", "B>8"), "plain",
      "Defect: batch blocks of 4 past the first read the first block's K and V (the base is not advanced).")
_sdpa("sdpa_batch_block8_short_key", "batch_block8_short_key", ("B>8",), "plain",
      "Defect: batch elements past the first block of 8 see one key fewer (the block's key bound is Lk - 1).")
_sdpa("sdpa_bwd_dq_qtile2_unscaled", "bwd_dq_qtile2_unscaled", ("Lq>128", "D=256,Lq>64"), "gradients",
      "Defect: the backward's dQ of rows past the first tile of 128 is not multiplied by the softmax scale.")
_sdpa("sdpa_bwd_d256_dkdv_first_qtile", "bwd_d256_dkdv_first_qtile", ("D=256,Lq>64",), "gradients",
      "Defect: at head dim 256, dK and dV accumulate over the first query tile of 64 only.")


# ---- the numpy variant kernels ----------------------------------------------------------------
def _variant(name: str, changed: Callable[[Case], dict | None], boundaries: tuple[str, ...], family: str,
             doc: str) -> type:
    """A VariantKernel whose forward, where `changed(case)` gives defect hooks or case changes, takes them.
    `changed` returns {"hooks": {...}} for variant_forward's defects or {"case": {...}} for case fields."""
    def forward(self, case: Case):
        ch = changed(case) or {}
        c = case.replace(**ch["case"]) if "case" in ch else case
        return variant_bugs.variant_forward(c, **ch.get("hooks", {}))
    cls = type(name, (variant_bugs.VariantKernel,), {"forward": forward, "__doc__": doc, "__module__": __name__})
    BUGS[name] = BranchBug("numpy", doc, boundaries, family)
    globals()[name] = cls
    return cls


def _on_split(hooks: dict) -> Callable[[Case], dict | None]:
    return lambda c: {"hooks": hooks} if split_path(c.shape["Lq"], c.shape["Lk"]) else None


def _kv_head_slopes(c: Case) -> dict | None:
    g = c.shape["Hq"] // c.shape["Hkv"]
    if c.alibi_slopes is None or g <= PACK:
        return None
    sl = np.asarray(c.alibi_slopes, dtype=np.float64)
    first = (np.arange(c.shape["Hq"]) // g) * g
    return {"case": {"alibi_slopes": sl[..., first]}}


def _causal_off_on_split(c: Case) -> dict | None:
    return {"case": {"causal": None}} if c.causal is not None and split_path(c.shape["Lq"], c.shape["Lk"]) else None


_variant("np_split_sink_ignored", _on_split({"sink_ignored": True}), ("split-KV", "split-KV-2048"), "sinks",
         "Defect: on the split-KV path the sink is left out of the merge (it joins no split's denominator).")
_variant("np_split_window_ignored", _on_split({"window_ignored": True}), ("split-KV", "split-KV-2048"), "window",
         "Defect: on the split-KV path the sliding window is not applied (each split sees all its keys).")
_variant("np_split_alibi_clamped",
         lambda c: ({"case": {"alibi_slopes": np.maximum(c.alibi_slopes, 0.0)}}
                    if c.alibi_slopes is not None and split_path(c.shape["Lq"], c.shape["Lk"]) else None),
         ("split-KV", "split-KV-2048"), "alibi",
         "Defect: on the split-KV path negative ALiBi slopes are clamped to 0 (that path assumes slopes >= 0).")
_variant("np_alibi_packed_kv_slope", _kv_head_slopes, ("group>8", "group>16", "group>64"), "alibi",
         "Defect: on the packed-GQA path (more than 8 query heads per KV head) every query head takes the ALiBi "
         "slope of its group's first head.")
_variant("np_split_causal_ignored", _causal_off_on_split, ("split-KV", "split-KV-2048"), "causal",
         "Defect: on the split-KV path the causal mask is not applied (each split sees all its keys).")


# ---- flash-attention 2's flash_attn_func ------------------------------------------------------
def _flash(name: str, st: flash.Stages, boundaries: tuple[str, ...], family: str, doc: str) -> Callable:
    fn = flash.make_flash_attn_func(st, name)
    fn.__doc__ = doc
    BUGS[name] = BranchBug("flash_attn", doc, boundaries, family)
    globals()[name] = fn
    return fn


def _alibi_abs(slopes, lq, lk, offset):
    return flash.alibi_bias(slopes.abs(), lq, lk, offset)


def _window_last_key_tile(lq, lk, causal, window, offset, device):
    """The left window bound applied only in the last key tile (the masking steps stop one tile early)."""
    vis = flash.visible(lq, lk, causal, (-1, window[1]), offset, device)
    left_ok = flash.visible(lq, lk, False, (window[0], -1), offset, device)
    j = torch.arange(lk, device=device)[None, :]
    return vis & (left_ok | (j // KEY_TILE < (lk - 1) // KEY_TILE))


_flash("fa_alibi_abs_slope", flash.replace(alibi=_alibi_abs), ANY, "alibi",
       "Defect: the ALiBi slope's sign is dropped (|slope|), right for the usual positive schedules.")
_flash("fa_window_last_key_tile", flash.replace(visible=_window_last_key_tile),
       tuple(b.id for b in BOUNDARIES if b.shape["Lk"] > KEY_TILE), "window",
       "Defect: the window's left bound masks only the last key tile of 128; earlier tiles see keys outside it.")


def fa_alibi_lse_no_bias(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                         softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Defect: with ALiBi the output is right but the returned lse is that of the logits without the bias."""
    ret = flash.flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                deterministic, return_attn_probs)
    if not return_attn_probs or alibi_slopes is None:
        return ret
    with torch.no_grad():
        plain = flash.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, None, deterministic,
                                      True)
    return ret[0], plain[1], ret[2]


BUGS["fa_alibi_lse_no_bias"] = BranchBug("flash_attn", fa_alibi_lse_no_bias.__doc__, ANY, "alibi")
