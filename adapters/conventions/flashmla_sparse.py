"""The `flashmla_sparse` convention: FlashMLA's DeepSeek sparse attention prefill `flash_mla_sparse_fwd`.

    out, max_logits, lse = flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                                                topk_length=None)

(deepseek-ai/FlashMLA `flash_mla/flash_mla_interface.py`; the definitions of its results in
`tests/ref.py`, `ref_sparse_attn_fwd`). What the convention says:

- q [s_q, h_q, 576], kv [s_kv, h_kv, 576] (one latent row per key, V = its first d_v = 512
  dims: `mla_latent.py`), indices [s_q, h_kv, topk] int32: the keys query i of that KV head
  attends to. An index of -1, or any index >= s_kv, is invalid and masked (never read);
  `topk` is a multiple of 128 in the kernels (their `topk % B_TOPK` asserts), so rows carry
  many invalid entries;
- `sm_scale` is required; `attn_sink` [h_q] float32 scales the output by
  exp(lse) / (exp(lse) + exp(sink)) and is left out of the returned lse and max_logits;
- out [s_q, h_q, 512]; max_logits [s_q, h_q]: the largest scaled logit over the valid
  indices, -inf for a row with none; lse [s_q, h_q]: natural log of the sum of exp of the
  scaled logits (since FlashMLA's January 2026 kernels; base 2 before), +inf for a row with
  none (that row outputs 0).

What the spec adds (ATTN-SPARSE-1..3): the valid indices are a set. Their order does not
matter, and an index given twice counts once. Upstream's `ref_sparse_attn_fwd` gathers the
indices as given, so a duplicate counts twice there; its tests draw no duplicates. The spec
chooses the set: a duplicate is the same key, and attention over a set of keys does not
depend on how often a caller lists it. A kernel that counts it twice fails ATTN-SPARSE-1.

How a Case becomes the call: every batch element's keys are placed into one kv of
B * Lk rows (permuted by the case seed, so an index is not a position) plus spare rows that
hold finite poison, one of them last (where a -1 read as Python's kv[-1] lands); the queries
of all batch elements are the s_q rows; each row's indices are the keys the spec's
visibility lets it see (mask, causal, window, lengths: the same for every query head of a
KV head group, else the case is outside the convention), in an order drawn from the seed,
padded with -1 and out-of-range indices. `packing["sparse_duplicates"]` repeats some of them.
One call per KV head (h_kv = 1, as FlashMLA runs). The spec's lse includes the sink
(ATTN-SINK-2): the adapter adds it to the kernel's.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from attnconf.reference import Case, round_to
from attnconf.reference.attention import visibility

from ..base import ConventionViolation, Result
from . import mla_latent
from .common import Convention, ConventionAdapter, inputs_finite, lse_to_spec

KEYWORDS = ("q", "kv", "indices", "sm_scale", "d_v", "attn_sink")
FEATURES = frozenset({"mask", "causal_top_left", "causal_bottom_right", "window_top_left", "window_bottom_right",
                      "mask_with_causal", "gqa", "custom_scale", "cross", "dv_ne_dk", "q_lengths", "kv_lengths",
                      "lse", "sinks", "sparse_indices", "latent"})
OUTSIDE = ("gradients (no backward)", "dropout", "additive bias", "soft cap", "ALiBi",
           "masks that differ between the query heads of one KV head",
           "head dims with no latent form (Dv > 512 or Dk + Dv > 576, unless V = K[..., :512] with Dk = 576)")
TOPK_BLOCK = 128


def case_visibility(case: Case) -> np.ndarray:
    s = case.shape
    return visibility((s["B"], s["Hq"], s["Lq"], s["Lk"]), mask=case.mask, causal=case.causal,
                      q_lengths=case.q_lengths, kv_lengths=case.kv_lengths, window=case.window,
                      window_align=case.window_align)


def index_rows(case: Case, vis: np.ndarray, rows: np.ndarray, n_kv: int) -> np.ndarray:
    """indices (B * Lq, topk) int32 for one KV head's visibility vis (B, Lq, Lk): key j of batch b is kv row
    rows[b * Lk + j]; valid indices in a drawn order, duplicates where the packing asks, the rest invalid."""
    B, Lq, Lk = vis.shape
    rng = np.random.default_rng([case.seed, 47])
    dup = bool(case.packing.get("sparse_duplicates", False))
    lists = []
    for b in range(B):
        for i in range(Lq):
            idx = rows[b * Lk + np.flatnonzero(vis[b, i])]
            if dup and idx.size:
                idx = np.concatenate([idx, rng.choice(idx, size=max(1, idx.size // 2))])
            lists.append(rng.permutation(idx))
    topk = TOPK_BLOCK * max(1, math.ceil(max((x.size for x in lists), default=0) / TOPK_BLOCK))
    out = np.empty((len(lists), topk), dtype=np.int64)
    for r, idx in enumerate(lists):
        pad = np.where(rng.random(topk - idx.size) < 0.5, -1, n_kv + rng.integers(0, 3, topk - idx.size))
        row = np.concatenate([idx, pad])
        out[r] = row if rng.random() < 0.5 else rng.permutation(row)
    return out.astype(np.int32)


class FlashMLASparse(Convention):
    def requirements(self, case: Case) -> set[str]:
        return set(case.features())

    def expressible(self, case: Case):
        ok = mla_latent.expressible(case)
        if ok is not True:
            return ok
        if case.sinks is not None and case.dtype == "float64":     # below float64 the float32 sink is exact enough
            sinks = np.asarray(case.sinks, dtype=np.float64)
            if not np.array_equal(sinks.astype(np.float32).astype(np.float64), sinks, equal_nan=True):
                return "float64 sinks that float32 cannot hold (the convention's attn_sink is float32)"
        s = case.shape
        g = s["Hq"] // s["Hkv"]
        vis = case_visibility(case).reshape(s["B"], s["Hkv"], g, s["Lq"], s["Lk"])
        if not (vis == vis[:, :, :1]).all():
            return "a visibility that differs between the query heads of one KV head (indices are [s_q, h_kv, topk])"
        return True

    def call(self, ad: ConventionAdapter, case: Case, lat: mla_latent.Latent, vis: np.ndarray, g: int):
        s = case.shape
        B, Lq, Lk = s["B"], s["Lq"], s["Lk"]
        group = s["Hq"] // s["Hkv"]
        heads = slice(g * group, (g + 1) * group)
        rng = np.random.default_rng([case.seed, 53, g])
        spare = 1 + int(rng.integers(0, 3))
        n_kv = B * Lk + spare
        perm = rng.permutation(B * Lk)                      # key (b, j) -> kv row perm[b * Lk + j]; poison after
        kv = round_to(3.0 + 4.0 * rng.standard_normal((n_kv, 1, mla_latent.D_QK)), case.dtype)
        kv[perm, 0] = lat.c[:, g].reshape(B * Lk, mla_latent.D_QK)
        indices = index_rows(case, vis[:, g * group], perm, n_kv)
        t = case.dtype
        q = lat.q[:, heads].transpose(0, 2, 1, 3).reshape(B * Lq, group, mla_latent.D_QK)
        sink = None if case.sinks is None else torch.tensor(np.asarray(case.sinks)[heads], dtype=torch.float32,
                                                            device=ad.device)
        kwargs = dict(q=ad.tensor(np.ascontiguousarray(q), t), kv=ad.tensor(kv, t),
                      indices=torch.from_numpy(indices[:, None, :].copy()).to(ad.device),
                      sm_scale=float(case.effective_scale if lat.scale is None else lat.scale),
                      d_v=mla_latent.D_V, attn_sink=sink)
        with torch.no_grad():
            ret = ad.invoke(kwargs, None)
        if not isinstance(ret, (tuple, list)) or len(ret) != 3:
            raise ConventionViolation("ATTN-OP-2", f"kernel returned {type(ret).__name__}; the {self.name} "
                                      "convention returns (out, max_logits, lse)")
        out = ad.array(ret[0], (B * Lq, group, mla_latent.D_V), f"output of KV head {g}")
        m = ad.array(ret[1], (B * Lq, group), f"max_logits [s_q, h_q] of KV head {g}", floating=True)
        lse = ad.array(ret[2], (B * Lq, group), f"lse [s_q, h_q] of KV head {g}")
        return out, m, lse, ad.out_dtype(ret[0])

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError(f"the {self.name} convention has no backward")
        s = case.shape
        B, Lq = s["B"], s["Lq"]
        group = s["Hq"] // s["Hkv"]
        lat = mla_latent.latent(case)
        vis = case_visibility(case)
        out = np.zeros(case.out_shape)
        lse = np.zeros(case.out_shape[:3])
        max_logits = np.zeros(case.out_shape[:3])
        dtype = case.dtype
        for g in range(s["Hkv"]):
            o, m, l, dtype = self.call(ad, case, lat, vis, g)
            hs = slice(g * group, (g + 1) * group)
            out[:, hs] = o[..., : s["Dv"]].reshape(B, Lq, group, s["Dv"]).transpose(0, 2, 1, 3)
            l = lse_to_spec(l, case, empty=np.inf, base2=False, name=self.name,
                            where=lambda i, g=g: f"query row {i[0]}, head {g * group + i[1]}")
            check_max_logits(m, l, vis[:, hs].transpose(0, 2, 1, 3).reshape(B * Lq, group, -1), case, self.name)
            max_logits[:, hs] = m.reshape(B, Lq, group).transpose(0, 2, 1)
            lse[:, hs] = l.reshape(B, Lq, group).transpose(0, 2, 1)
        if case.sinks is not None:
            lse = np.logaddexp(lse, np.asarray(case.sinks, dtype=np.float64)[None, :, None])
        return Result(out=out, out_dtype=dtype, lse=lse if want_lse else None, kernel=ad.name,
                      notes={"latent_offset": lat.offset, "max_logits": max_logits})


def check_max_logits(m: np.ndarray, lse: np.ndarray, vis: np.ndarray, case: Case, name: str) -> None:
    """ATTN-SPARSE-3, what the adapter can say without the reference: -inf exactly on rows with no valid index,
    finite elsewhere (for finite inputs); its value against the reference is conformance/test_sparse.py's.
    A finite max_logits on a row with no valid index is a key read through an invalid index (ATTN-SPARSE-2)."""
    empty = ~vis.any(axis=-1)
    bad = (np.isneginf(m) != empty) | np.isnan(m) | np.isposinf(m)
    if not inputs_finite(case):
        bad &= ~np.isnan(m)
    if bad.any():
        r, h = (int(i) for i in np.argwhere(bad)[0])
        if empty[r, h] and np.isfinite(m[r, h]):     # a logit where no index is valid: an invalid index was read
            raise ConventionViolation("ATTN-SPARSE-2", f"max_logits is {m[r, h]} at query row {r}, head {h}, which "
                                      "has no valid index: the kernel scored a key named by -1 or an index >= s_kv "
                                      f"({int(bad.sum())} such value(s))")
        want = "-inf (no valid index)" if empty[r, h] else "the largest scaled logit (finite)"
        raise ConventionViolation("ATTN-SPARSE-3", f"max_logits is {m[r, h]} at query row {r}, head {h}; the {name} "
                                  f"convention gives {want} ({int(bad.sum())} such value(s))")


def max_logits_of(res: Result) -> Any:
    return res.notes.get("max_logits")


CONVENTION = FlashMLASparse(
    name="flashmla_sparse", entry="flash_mla.flash_mla_sparse_fwd", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES, outside=OUTSIDE)
