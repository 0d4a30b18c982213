"""Calling conventions for `--backend=torch --kernel=MODULE:ATTR --convention=NAME`.

Each convention is one small module that turns a `Case` into exactly the upstream
public call (every argument bound by keyword) and the result back into the spec's
terms (layout, log base, the value of an empty row):

| name | upstream entry point | module |
|---|---|---|
| `flash_attn` | `flash_attn.flash_attn_func` | `flash_attn.py` |
| `flash_attn_varlen` | `flash_attn.flash_attn_varlen_func` | `flash_attn_varlen.py` |
| `flash_attn_kvcache` | `flash_attn.flash_attn_with_kvcache` | `flash_attn_kvcache.py` |
| `flashinfer_prefill` | `flashinfer.single_prefill_with_kv_cache` | `flashinfer_prefill.py` |
| `flashinfer_decode` | `flashinfer.single_decode_with_kv_cache` | `flashinfer_decode.py` |
| `flash_attn3` | flash-attention 3 (hopper) `flash_attn_interface.flash_attn_func` | `flash_attn3.py` |
| `flash_attn4` | flash-attention 4 (cute) `flash_attn.cute.flash_attn_func` | `flash_attn4.py` |
| `sageattn` | `sageattention.sageattn` | `sageattn.py` |
| `flashmla_kvcache` | `flash_mla.flash_mla_with_kvcache` (+ its module's `get_mla_metadata`) | `flashmla_kvcache.py` |
| `flashmla_sparse` | `flash_mla.flash_mla_sparse_fwd` | `flashmla_sparse.py` |
| `flashinfer_batch_prefill` | `flashinfer.BatchPrefillWithPagedKVCacheWrapper` (the class) | `flashinfer_batch_prefill.py` |
| `flashinfer_batch_decode` | `flashinfer.BatchDecodeWithPagedKVCacheWrapper` (the class) | `flashinfer_batch_decode.py` |

`common.py` holds what they share: the `Convention` description (what it can
express, its default scope, what lies outside it) and `ConventionAdapter`, the
adapter that wraps a kernel in one of them. Importing this package does not
import torch; a convention module imports it when it is loaded.
"""
from __future__ import annotations

import importlib

MODULES = {
    "flash_attn": "flash_attn",
    "flash_attn_varlen": "flash_attn_varlen",
    "flash_attn_kvcache": "flash_attn_kvcache",
    "flashinfer_prefill": "flashinfer_prefill",
    "flashinfer_decode": "flashinfer_decode",
    # issue 26, part a: flash-attention 3 and 4, SageAttention
    "flash_attn3": "flash_attn3",
    "flash_attn4": "flash_attn4",
    "sageattn": "sageattn",
    # issue 26, part b: MLA, DeepSeek sparse attention, FlashInfer's paged batch wrappers
    "flashmla_kvcache": "flashmla_kvcache",
    "flashmla_sparse": "flashmla_sparse",
    "flashinfer_batch_prefill": "flashinfer_batch_prefill",
    "flashinfer_batch_decode": "flashinfer_batch_decode",
}
NAMES = tuple(MODULES)


def get(name: str):
    """The `Convention` object called `name` (KeyError if there is none)."""
    return importlib.import_module(f"{__name__}.{MODULES[name]}").CONVENTION
