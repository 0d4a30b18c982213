"""The `flash_attn_kvcache` convention: flash-attention's `flash_attn_with_kvcache` (forward only).

    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False)

(Dao-AILab/flash-attention `flash_attn/flash_attn_interface.py`). Every argument is bound
by keyword. The convention: q (B, Lq, Hq, D); the cache holds `cache_seqlens[b]` keys of
sequence b; new `k`, `v` (B, n, Hkv, D), if given, are written *in place* into the cache at
positions cache_seqlens[b] .. cache_seqlens[b] + n - 1 and attended to, so sequence b has
cache_seqlens[b] + n keys (`block_info.h`: actual_seqlen_k = seqlen_k_cache + seqlen_knew);
causal, windows and ALiBi align bottom-right on that length, as in `flash_attn`. The cache is
contiguous, (B_cache, capacity, Hkv, D) with `cache_batch_idx` picking sequence b's row, or
paged, (num_blocks, page_size, Hkv, D) with `block_table[b, j]` the physical block that holds
logical positions j * page_size .. (j + 1) * page_size - 1. The lse (B, Hq, Lq) is natural
log, +inf for a row that sees no key. There is no backward.

How a Case becomes that call. Key b's valid keys (kv_lengths[b], else Lk) are split: the
last n (`packing["new_keys"]`) are passed as k/v and the rest stand in the cache. The
representation comes from `case.packing` where it says so, else from the case seed (and
only within the kernel's declared scope: no pages unless "paged", no appends unless
"kvcache_append" is declared):

- `page_size`: 0 = contiguous cache, else a paged cache with blocks of that size;
- `block_seed`: the permutation of physical blocks (paged) or of cache rows (contiguous,
  with `cache_batch_idx`); `spare_blocks`/`spare_rows` unused blocks or rows;
- `new_keys`: n, the keys appended in the call (at most the shortest sequence);
- `spare_slots`: capacity beyond the longest sequence.

Every slot that holds no key of the case (beyond a sequence, spare rows and blocks) holds
NaN (ATTN-MEM-1: a kernel that reads one, even times a zero weight, returns NaN), or finite
values that would change the result if read where the dtype cannot store NaN. After the call the adapter
checks, bitwise, that the appended keys landed where the convention says and that nothing
else in the cache changed; otherwise the call is a `ConventionViolation` of ATTN-PAGED-3.
Rotary embedding and `cache_leftpad` are outside the spec (never passed). The docstring says
"page_block_size must be a multiple of 256" (`flash_api.cpp` checks it), so page sizes are 256
or 512: a sequence spans one or two pages unless it is longer than 256 keys, and the paged
strategies draw such lengths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnconf.reference import Case

from ..base import ConventionViolation, Result
from .common import Convention, ConventionAdapter, bottom_right_requirements, lengths, unread
from .flash_attn import common_keywords, lse_from_flash

KEYWORDS = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
            "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size", "softcap",
            "rotary_interleaved", "alibi_slopes", "num_splits", "return_softmax_lse")
FEATURES = frozenset({"causal_bottom_right", "window_bottom_right", "softcap", "alibi", "gqa", "custom_scale",
                      "cross", "dv_ne_dk", "kv_lengths", "lse", "paged", "kvcache_append", "noncontiguous"})
OUTSIDE = ("gradients (no backward)", "dropout", "boolean masks", "additive bias", "query padding",
           "top-left causal or window with len_q != len_k", "attention sinks", "rotary embedding",
           "cache_leftpad")
PAGE_SIZES = (256, 512)   # "page_block_size must be a multiple of 256" (flash_attn_with_kvcache docstring)


@dataclass
class Representation:
    page_size: int
    new_keys: int
    block_seed: int
    spare_blocks: int
    spare_slots: int
    batch_idx: bool


def representation(case: Case, caps: frozenset[str], contract=None) -> Representation:
    """The cache layout for this case: case.packing where it says, else drawn from the case seed within `caps`
    and the representations the kernel declares it takes (adapters/contract.py)."""
    p = case.packing
    rng = np.random.default_rng([case.seed, 23])
    _, kl = lengths(case)
    most = (int(kl.min()) if kl.size else 0)
    page = p.get("page_size")
    sizes = contract.page_sizes(PAGE_SIZES) if contract is not None else PAGE_SIZES
    if page is None:
        paged = "paged" in caps and bool(sizes) and rng.random() < 0.6
        if contract is not None and not contract.takes("contiguous") and "paged" in caps and sizes:
            paged = True
        page = int(rng.choice(sizes)) if paged else 0
    new = p.get("new_keys")
    if new is None:
        new = int(rng.integers(0, most + 1)) if "kvcache_append" in caps and most else 0
    rep = Representation(int(page), int(new), int(p.get("block_seed", rng.integers(2**31))),
                         int(p.get("spare_blocks", rng.integers(0, 3))), int(p.get("spare_slots", rng.integers(0, 4))),
                         bool(p.get("cache_batch_idx", rng.random() < 0.5)) and not page
                         and (contract is None or contract.takes("cache_batch_idx") or "cache_batch_idx" in p))
    if rep.page_size < 0 or rep.new_keys < 0:
        raise ValueError(f"packing page_size and new_keys must be >= 0; got {rep.page_size}, {rep.new_keys}")
    return rep


@dataclass
class Cache:
    """The numpy side of a cache: what goes in, and what must come out."""

    k: np.ndarray              # (rows or blocks, capacity or page, Hkv, Dk)
    v: np.ndarray
    k_after: np.ndarray        # what the cache must hold after the call
    v_after: np.ndarray
    k_new: np.ndarray | None   # (B, n, Hkv, Dk)
    v_new: np.ndarray | None
    seqlens: np.ndarray        # int32 (B,)
    block_table: np.ndarray | None
    batch_idx: np.ndarray | None
    where: list                # (b, t) -> (row/block, slot) of every appended key


def build_cache(case: Case, rep: Representation) -> Cache:
    s = case.shape
    B, hkv, dk, dv, lq = s["B"], s["Hkv"], s["Dk"], s["Dv"], s["Lq"]
    _, kl = lengths(case)
    n = rep.new_keys
    if n > (int(kl.min()) if kl.size else 0):
        raise ValueError(f"packing new_keys={n} exceeds the shortest sequence's {(int(kl.min()) if kl.size else 0)} keys")
    seqlens = (kl - n).astype(np.int32)
    capacity = max(int(kl.max(initial=0)), lq, 1) + rep.spare_slots
    rng = np.random.default_rng([case.seed, rep.block_seed, 29])
    k_all = np.swapaxes(case.k, 1, 2)                                # (B, Lk, Hkv, Dk)
    v_all = np.swapaxes(case.v, 1, 2)

    if rep.page_size:
        page = rep.page_size
        per_seq = math.ceil(capacity / page)
        n_blocks = B * per_seq + rep.spare_blocks
        phys = rng.permutation(n_blocks)
        table = phys[: B * per_seq].reshape(B, per_seq).astype(np.int32)
        shape_k, shape_v = (n_blocks, page, hkv, dk), (n_blocks, page, hkv, dv)
        slot_of = lambda b, t: (table[b, t // page].astype(np.int64), t % page)  # noqa: E731
        batch_idx = None
    else:
        table = None
        rows = B + (rep.spare_blocks if rep.batch_idx else 0)
        perm = rng.permutation(rows) if rep.batch_idx else np.arange(rows)
        batch_idx = perm[:B].astype(np.int32) if rep.batch_idx else None
        shape_k, shape_v = (rows, capacity, hkv, dk), (rows, capacity, hkv, dv)
        slot_of = lambda b, t: (np.full(t.shape, perm[b], dtype=np.int64), t)  # noqa: E731
    # unused slots (past cache_seqlens, spare rows and blocks): NaN, else finite values unlike the case's
    # that would move the result if read (ATTN-MEM-1)
    k_cache = unread(round_like(rng.normal(size=shape_k) + 2.0, case.dtype), case.dtype)
    v_cache = unread(round_like(40.0 + 10.0 * rng.normal(size=shape_v), case.dtype), case.dtype)
    for b in range(B):
        r, c = slot_of(b, np.arange(int(seqlens[b])))
        k_cache[r, c], v_cache[r, c] = k_all[b, : int(seqlens[b])], v_all[b, : int(seqlens[b])]
    k_after, v_after = k_cache.copy(), v_cache.copy()
    where = []
    for b in range(B):
        t = np.arange(int(seqlens[b]), int(seqlens[b]) + n)
        r, c = slot_of(b, t)
        k_after[r, c], v_after[r, c] = k_all[b, t], v_all[b, t]
        where += [(b, int(tt), int(rr), int(cc)) for tt, rr, cc in zip(t, r, c)]
    if n:
        k_new = np.stack([k_all[b, seqlens[b]:seqlens[b] + n] for b in range(B)])
        v_new = np.stack([v_all[b, seqlens[b]:seqlens[b] + n] for b in range(B)])
    else:
        k_new = v_new = None
    return Cache(k_cache, v_cache, k_after, v_after, k_new, v_new, seqlens, table, batch_idx, where)


def round_like(x: np.ndarray, dtype: str) -> np.ndarray:
    from attnconf.reference import round_to

    return round_to(x, dtype)


class FlashAttnKVCache(Convention):
    def expressible(self, case: Case):
        _, kl = lengths(case)
        new = case.packing.get("new_keys") or 0
        if kl.size and new > int(kl.min()):
            return f"packing new_keys={new} exceeds the shortest sequence's {int(kl.min())} keys"
        page = case.packing.get("page_size") or 0
        if page % 256:
            return f"page_size {page}: the convention's paged cache takes page sizes that are multiples of 256"
        return super().expressible(case)

    def plain_packing(self, case: Case, ad: ConventionAdapter) -> dict:
        """The plainest representation the kernel takes: a contiguous cache without cache_batch_idx (else its
        smallest page), so that ATTN-SCOPE-1 blames a refused representation, not the feature under probe."""
        contract = ad.contract
        if contract is None or contract.takes("contiguous"):
            return {**case.packing, "page_size": 0, "cache_batch_idx": False}
        return {**case.packing, "page_size": min(contract.page_sizes(PAGE_SIZES) or PAGE_SIZES)}

    def representation_words(self, case: Case, ad: ConventionAdapter) -> str:
        rep = representation(case, ad.capabilities, ad.contract)
        if rep.page_size:
            return f"a paged cache (block_table, page size {rep.page_size})"
        return "a contiguous cache" + (" with cache_batch_idx" if rep.batch_idx else "")

    def requirements(self, case: Case) -> set[str]:
        f = bottom_right_requirements(case)
        if case.packing.get("page_size"):
            f.add("paged")
        if case.packing.get("new_keys"):
            f.add("kvcache_append")
        return f

    def call(self, ad: ConventionAdapter, case: Case, rep: Representation, want_lse: bool):
        c = build_cache(case, rep)
        t = case.dtype
        q = ad.tensor(case.q, t).transpose(1, 2)
        if case.layout != "noncontiguous":
            q = q.contiguous()
        k_cache, v_cache = ad.tensor(c.k, t), ad.tensor(c.v, t)
        k_new = None if c.k_new is None else ad.tensor(c.k_new, t)
        v_new = None if c.v_new is None else ad.tensor(c.v_new, t)
        as_int = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a, np.int32)).to(ad.device)  # noqa: E731
        kwargs = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k_new, v=v_new, rotary_cos=None, rotary_sin=None,
                      cache_seqlens=as_int(c.seqlens), cache_batch_idx=as_int(c.batch_idx), cache_leftpad=None,
                      block_table=as_int(c.block_table), **common_keywords(ad, case), rotary_interleaved=True,
                      num_splits=0, return_softmax_lse=want_lse)
        with torch.no_grad():
            ret = ad.invoke(kwargs, None)
        self.check_cache(ad, c, k_cache, v_cache)
        return ad.unpack(ret, want_lse, "return_softmax_lse")

    @staticmethod
    def check_cache(ad: ConventionAdapter, c: Cache, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """ATTN-PAGED-3: the appended keys are where the convention says, and nothing else changed."""
        from attnconf.adapters.torch.convert import to_numpy

        for name, got_t, want, before in (("k_cache", k_cache, c.k_after, c.k), ("v_cache", v_cache, c.v_after, c.v)):
            got = to_numpy(got_t)
            if tuple(got.shape) != tuple(want.shape):
                raise ConventionViolation("ATTN-PAGED-3", f"{name} changed shape to {tuple(got.shape)}")
            wrong = ~np.all((got == want) | (np.isnan(got) & np.isnan(want)), axis=(-2, -1))   # (rows, slots)
            if not wrong.any():
                continue
            appended = {(r, s): (b, t) for b, t, r, s in c.where}
            r, s = (int(i) for i in np.argwhere(wrong)[0])
            if (r, s) in appended:
                b, t = appended[(r, s)]
                got_row = np.argwhere(np.all(got == want[r, s], axis=(-2, -1)))
                seen = f"; it is at {tuple(int(i) for i in got_row[0])}" if got_row.size else ""
                raise ConventionViolation("ATTN-PAGED-3", f"appended key {t} of sequence {b} (cache_seqlens "
                                          f"{int(c.seqlens[b])}) is not at {name}[{r}, {s}]{seen}; "
                                          f"{int(wrong.sum())} slot(s) differ from what the convention says")
            raise ConventionViolation("ATTN-PAGED-3", f"{name}[{r}, {s}] changed, though no appended key belongs "
                                      f"there ({int(wrong.sum())} slot(s) differ from what the convention says)")

    def run(self, ad: ConventionAdapter, case: Case, *, grads: bool, want_lse: bool) -> Result:
        if grads:
            raise ValueError("the flash_attn_kvcache convention has no backward")
        s = case.shape
        rep = representation(case, ad.capabilities, ad.contract)
        out_t, _ = self.call(ad, case, rep, False)
        out = ad.array(out_t, (s["B"], s["Lq"], s["Hq"], s["Dv"]), "output").transpose(0, 2, 1, 3)
        res = Result(out=np.ascontiguousarray(out), out_dtype=ad.out_dtype(out_t), kernel=ad.name,
                     notes={"page_size": rep.page_size, "new_keys": rep.new_keys})
        if want_lse:
            out2_t, lse_t = self.call(ad, case, rep, True)
            res.out_with_lse = ad.array(out2_t, (s["B"], s["Lq"], s["Hq"], s["Dv"]),
                                        "output (return_softmax_lse=True)").transpose(0, 2, 1, 3)
            res.lse = lse_from_flash(ad.array(lse_t, (s["B"], s["Hq"], s["Lq"]), "lse (B, H, Lq)"), case, self.name)
        return res


CONVENTION = FlashAttnKVCache(
    name="flash_attn_kvcache", entry="flash_attn.flash_attn_with_kvcache", keywords=KEYWORDS, features=FEATURES,
    default=FEATURES - {"dv_ne_dk"}, outside=OUTSIDE, writes=("k_cache", "v_cache"))
