"""The `flashmla_kvcache` convention: FlashMLA's dense MLA decode `flash_mla_with_kvcache` (forward only).

    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, softmax_lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                              tile_scheduler_metadata, num_splits,
                                              softmax_scale=None, causal=False)

(deepseek-ai/FlashMLA `flash_mla/flash_mla_interface.py`; reference semantics in
`tests/test_flash_mla_dense_decoding.py`, `reference_torch`). What the convention says:

- q (B, s_q, h_q, 576); k_cache (num_blocks, page_block_size = 64, h_kv, 576), paged:
  `block_table[b, j]` (int32) is the block holding logical keys 64 j .. 64 j + 63 of sequence b,
  `cache_seqlens[b]` (int32) how many keys sequence b has; slots past it hold anything;
- V is the first `head_dim_v` = 512 dims of the same cache rows (MLA's absorbed form,
  `mla_latent.py`); scores use all 576 dims;
- `softmax_scale` None means 1/sqrt(576) (q's head dim); `causal` is bottom-right
  (`tril(diagonal=s_k - s_q)`), no effect when s_q = 1;
- GQA by contiguous head groups (`repeat_interleave`); FlashMLA itself runs h_kv = 1, so the
  adapter makes one call per KV head with that head's query group (h_kv = 1 in every call);
- returns (out (B, s_q, h_q, 512), softmax_lse (B, h_q, s_q) float32), the lse in natural log;
  a row that sees no key (cache_seqlens[b] = 0, or causal with s_k < s_q) outputs 0 with lse
  +inf, which the adapter maps to the spec's -inf (any other infinity breaks ATTN-LSE-2).

`get_mla_metadata` is looked up in the kernel's own module: the current FlashMLA's returns
`(FlashMLASchedMeta(), None)` and ignores its arguments, older ones return the two tensors;
either is passed on as it came, a fresh one per call. The cache's unused slots (past
`cache_seqlens` in the last page, and spare blocks) hold finite values that would move the
result if read; block placement is drawn from the case seed (`packing["block_seed"]`).
Masks, windows, soft cap, ALiBi, sinks, dropout and query padding are outside it.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

import numpy as np
import torch

from attnconf.reference import Case, round_to

from ..base import ConventionViolation, Result
from . import mla_latent
from .common import Convention, ConventionAdapter, bottom_right_requirements, lengths, lse_to_spec

PAGE = 64
KEYWORDS = ("q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata", "num_splits",
            "softmax_scale", "causal")
FEATURES = frozenset({"causal_bottom_right", "gqa", "custom_scale", "cross", "dv_ne_dk", "kv_lengths", "lse", "latent"})
OUTSIDE = ("gradients (no backward)", "dropout", "boolean masks", "additive bias", "query padding",
           "sliding windows", "soft cap", "ALiBi", "attention sinks", "top-left causal with len_q != len_k",
           "head dims with no latent form (Dv > 512 or Dk + Dv > 576, unless V = K[..., :512] with Dk = 576)")


def metadata_function(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """`get_mla_metadata` from the module that defines `fn` (the convention takes the pair from one module)."""
    module = inspect.getmodule(fn)
    return getattr(module, "get_mla_metadata", None)


def paged_cache(case: Case, c: np.ndarray, seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k_cache (num_blocks, 64, 1, D), block_table (B, pages)) holding the latent rows c (B, Lk, D) of one KV
    head, blocks permuted by the case seed, every slot beyond a sequence poisoned with finite values."""
    B, _, d = c.shape
    rng = np.random.default_rng([case.seed, int(case.packing.get("block_seed", 0)), 43])
    per_seq = max(1, math.ceil(int(seqlens.max(initial=0)) / PAGE))
    n_blocks = B * per_seq + int(case.packing.get("spare_blocks", rng.integers(0, 3)))
    table = rng.permutation(n_blocks)[: B * per_seq].reshape(B, per_seq).astype(np.int32)
    cache = round_to(3.0 + 4.0 * rng.standard_normal((n_blocks, PAGE, 1, d)), case.dtype)
    for b in range(B):
        t = np.arange(int(seqlens[b]))
        cache[table[b, t // PAGE], t % PAGE, 0] = c[b, t]
    return cache, table


class FlashMLAKVCache(Convention):
    def requirements(self, case: Case) -> set[str]:
        return bottom_right_requirements(case)

    def expressible(self, case: Case):
        ok = mla_latent.expressible(case)
        return ok if ok is not True else super().expressible(case)

    def check_signature(self, fn: Callable[..., Any]) -> str | None:
        reason = super().check_signature(fn)
        if reason is None and metadata_function(fn) is None:
            return (f"module {getattr(inspect.getmodule(fn), '__name__', '?')} has no get_mla_metadata; the "
                    f"{self.name} convention takes it from the kernel's own module ({self.entry})")
        return reason

    def call(self, ad: ConventionAdapter, case: Case, lat: mla_latent.Latent, g: int, seqlens: np.ndarray):
        s = case.shape
        group = s["Hq"] // s["Hkv"]
        heads = slice(g * group, (g + 1) * group)
        cache, table = paged_cache(case, lat.c[:, g], seqlens)
        t = case.dtype
        q = ad.tensor(np.ascontiguousarray(lat.q[:, heads].transpose(0, 2, 1, 3)), t)    # (B, s_q, group, 576)
        as_int = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.int32)).to(ad.device)  # noqa: E731
        cache_seqlens = as_int(seqlens)
        meta = metadata_function(ad.fn)(cache_seqlens, s["Lq"] * group, 1)
        meta, splits = (meta[0], meta[1]) if isinstance(meta, (tuple, list)) and len(meta) == 2 else (meta, None)
        kwargs = dict(q=q, k_cache=ad.tensor(cache, t), block_table=as_int(table), cache_seqlens=cache_seqlens,
                      head_dim_v=mla_latent.D_V, tile_scheduler_metadata=meta, num_splits=splits,
                      softmax_scale=lat.scale, causal=case.causal is not None)
        with torch.no_grad():
            ret = ad.invoke(kwargs, None)
        if not isinstance(ret, (tuple, list)) or len(ret) != 2:
            raise ConventionViolation("ATTN-OP-2", f"kernel returned {type(ret).__name__}; the {self.name} "
                                      "convention returns (out, softmax_lse)")
        out = ad.array(ret[0], (s["B"], s["Lq"], group, mla_latent.D_V), f"output of KV head {g}")
        lse = ad.array(ret[1], (s["B"], group, s["Lq"]), f"lse (B, h_q, s_q) of KV head {g}")
        return out, lse, ad.out_dtype(ret[0])

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError(f"the {self.name} convention has no backward")
        s = case.shape
        _, kl = lengths(case)
        lat = mla_latent.latent(case)
        group = s["Hq"] // s["Hkv"]
        out = np.zeros(case.out_shape)
        lse = np.zeros(case.out_shape[:3])
        dtype = case.dtype
        for g in range(s["Hkv"]):
            o, l, dtype = self.call(ad, case, lat, g, kl.astype(np.int32))
            out[:, g * group:(g + 1) * group] = o[..., : s["Dv"]].transpose(0, 2, 1, 3)
            lse[:, g * group:(g + 1) * group] = lse_to_spec(
                l, case, empty=np.inf, base2=False, name=self.name,
                where=lambda i, g=g: f"batch {i[0]}, head {g * group + i[1]}, query {i[2]}")
        return Result(out=out, out_dtype=dtype, lse=lse if want_lse else None, kernel=ad.name,
                      notes={"latent_offset": lat.offset, "page_size": PAGE})


CONVENTION = FlashMLAKVCache(
    name="flashmla_kvcache", entry="flash_mla.flash_mla_with_kvcache", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES, outside=OUTSIDE)
