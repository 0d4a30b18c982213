"""What FlashInfer's two paged batch wrappers share: the page table, the cache, and plan-then-run.

    wrapper = Wrapper(float_workspace_buffer, kv_layout="NHD" | "HND")
    wrapper.plan(<indptr>, <indices>, <last_page_len>, num_qo_heads, num_kv_heads, head_dim, page_size, ...)
    out = wrapper.run(q, paged_kv_cache)                   # or (out, lse) with return_lse=True

(flashinfer-ai/flashinfer `flashinfer/prefill.py` `BatchPrefillWithPagedKVCacheWrapper`,
`flashinfer/decode.py` `BatchDecodeWithPagedKVCacheWrapper`). A kernel in these conventions is
the wrapper class; the adapter instantiates it with a zeroed workspace (the decode wrapper's
docstring asks for zeros on first use) and `kv_layout` by keyword, binds plan's first seven or
eight arguments by position (their names have moved between releases) and the rest by keyword,
and run's `q`, `paged_kv_cache` by position and `return_lse` by keyword.

The page table of request b: its pages are `indices[indptr[b]:indptr[b + 1]]` (int32), every
page full except the last, which holds `last_page_len[b]` keys (1 .. page_size; a request with
no key has no page and last_page_len 0), so kv_len = (pages - 1) * page_size + last_page_len.
The cache is a tuple (k_cache, v_cache), each [max_num_pages, page_size, Hkv, D] ("NHD") or
[max_num_pages, Hkv, page_size, D] ("HND"), or one tensor [max_num_pages, 2, ...] holding both
(only when Dk = Dv). Page size, page placement, spare pages and the cache's form come from
`case.packing` (`page_size`, `block_seed`, `spare_blocks`, `kv_cache_format`) or the case seed;
page sizes are drawn from `PAGE_SIZES` (FlashInfer takes any, and 16 is only one of them).
Every slot no key of the case occupies (the tail of a last page, spare pages) holds finite
values that would move the result if read.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from attnconf.reference import Case, round_to

from ..base import KernelError, NotSupported
from .common import ConventionAdapter, first_line

PAGE_SIZES = (1, 3, 5, 7, 16, 17, 32)
WORKSPACE_BYTES = 32 * 1024 * 1024


@dataclass
class Pages:
    page_size: int
    indptr: np.ndarray          # int32 (B + 1,)
    indices: np.ndarray         # int32 (indptr[-1],)
    last_page_len: np.ndarray   # int32 (B,)
    k: np.ndarray               # (pages, page_size, Hkv, Dk): NHD, before the layout
    v: np.ndarray
    single: bool                # one [pages, 2, ...] tensor instead of the (k, v) tuple


def pages(case: Case, kv_len: np.ndarray) -> Pages:
    """The paged cache of the case's keys: request b holds kv_len[b] keys of case.k[b] / case.v[b]."""
    s = case.shape
    p = case.packing
    rng = np.random.default_rng([case.seed, int(p.get("block_seed", 0)), 59])
    size = int(p.get("page_size") or rng.choice(PAGE_SIZES))
    if size < 1:
        raise ValueError(f"packing page_size must be >= 1; got {size}")
    count = [math.ceil(int(n) / size) for n in kv_len]
    indptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int32)
    total = int(indptr[-1]) + int(p.get("spare_blocks", rng.integers(0, 3)))
    phys = rng.permutation(max(total, 1))[: int(indptr[-1])].astype(np.int32)
    last = np.array([n - (c - 1) * size if c else 0 for n, c in zip(kv_len, count)], dtype=np.int32)
    shape = (max(total, 1), size, s["Hkv"])
    k = round_to(2.0 + rng.standard_normal(shape + (s["Dk"],)), case.dtype)
    v = round_to(40.0 + 10.0 * rng.standard_normal(shape + (s["Dv"],)), case.dtype)
    for b, n in enumerate(int(x) for x in kv_len):
        t = np.arange(n)
        blocks = phys[indptr[b]:indptr[b + 1]]
        k[blocks[t // size], t % size] = np.swapaxes(case.k[b], 0, 1)[:n]
        v[blocks[t // size], t % size] = np.swapaxes(case.v[b], 0, 1)[:n]
    fmt = p.get("kv_cache_format", "single" if rng.random() < 0.5 else "tuple")
    if fmt not in ("single", "tuple"):
        raise ValueError(f"packing kv_cache_format must be 'single' or 'tuple'; got {fmt!r}")
    return Pages(size, indptr, phys, last, k, v, fmt == "single" and s["Dk"] == s["Dv"])


def cache_tensor(ad: ConventionAdapter, pg: Pages, dtype: str, layout: str):
    """paged_kv_cache as the wrapper's run takes it, in `layout`."""
    def one(x: np.ndarray) -> torch.Tensor:
        return ad.tensor(np.ascontiguousarray(x if layout == "NHD" else x.transpose(0, 2, 1, 3)), dtype)
    if pg.single:
        return ad.tensor(np.ascontiguousarray(np.stack([pg.k, pg.v], axis=1) if layout == "NHD"
                                              else np.stack([pg.k, pg.v], axis=1).transpose(0, 1, 3, 2, 4)), dtype)
    return one(pg.k), one(pg.v)


def int32(ad: ConventionAdapter, a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(ad.device)


def check_wrapper_class(cls: Any, entry: str, name: str) -> str | None:
    """None if `cls` is a class with plan and run, else a one-line reason."""
    if not inspect.isclass(cls):
        return f"{cls!r} is not a class; the {name} convention takes the wrapper class ({entry})"
    missing = [m for m in ("plan", "run") if not callable(getattr(cls, m, None))]
    if missing:
        return f"{cls.__name__} has no {' or '.join(missing)}; the {name} convention calls plan then run ({entry})"
    return None


def plan_and_run(ad: ConventionAdapter, layout: str, plan_args: tuple, plan_kwargs: dict[str, Any],
                 q: torch.Tensor, cache, want_lse: bool) -> Any:
    """Instantiate the wrapper, plan, run; the wrapper's own failures become KernelError, NotImplementedError
    NotSupported, and run's tensor arguments must come back unchanged (ad.invoke's ATTN-OP-8 check)."""
    ws = getattr(ad, "_flashinfer_workspace", None)
    if ws is None:
        ws = ad._flashinfer_workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=ad.device)
    cls: Callable[..., Any] = ad.fn
    try:
        wrapper = cls(ws, kv_layout=layout)
        wrapper.plan(*plan_args, **plan_kwargs)
    except NotImplementedError as exc:
        raise NotSupported(f"{ad.name} raised NotImplementedError in plan: {first_line(exc)}") from None
    except Exception as exc:
        raise KernelError(f"wrapper construction or plan raised {type(exc).__name__}: {first_line(exc)}") from exc

    if isinstance(cache, torch.Tensor):
        kwargs = {"q": q, "paged_kv_cache": cache, "return_lse": want_lse}

        def run(q, paged_kv_cache, return_lse):
            return wrapper.run(q, paged_kv_cache, return_lse=return_lse)
    else:                       # the (k_cache, v_cache) tuple, watched as two tensors
        kwargs = {"q": q, "k_cache": cache[0], "v_cache": cache[1], "return_lse": want_lse}

        def run(q, k_cache, v_cache, return_lse):
            return wrapper.run(q, (k_cache, v_cache), return_lse=return_lse)
    saved, ad.fn = ad.fn, run
    try:
        with torch.no_grad():
            return ad.invoke(kwargs, None)
    finally:
        ad.fn = saved
