"""The words of attnconf, declared once: dtypes, features, statuses, causal alignments, layouts.

Every module that names a dtype list, a capability, a record status or a cell state imports it from
here (`attnconf.spec.vocabulary`); nothing else re-declares one. The module imports nothing, so the
reference, the adapters, the engine and the reports can all depend on it.
"""
from __future__ import annotations

# ---- dtypes -----------------------------------------------------------------------------------
DTYPES = ("float64", "float32", "float16", "bfloat16")   # widest first: the order of every table
HALF_DTYPES = ("float16", "bfloat16")
ANY_DTYPE = "any"                                        # a cell of a clause that no dtype parametrizes

# ---- geometry of a case -----------------------------------------------------------------------
ALIGNMENTS = ("top_left", "bottom_right")                # causal masks, windows, chunks, ALiBi distances
LAYOUTS = ("contiguous", "noncontiguous", "broadcast_kv")

# ---- capabilities: the features a case exercises and an adapter declares ---------------------------
CAPABILITIES = frozenset({
    "mask",            # boolean mask
    "bias",            # additive float bias, -inf included
    "causal_top_left",
    "causal_bottom_right",
    "q_lengths",
    "kv_lengths",
    "gqa",
    "custom_scale",
    "dv_ne_dk",
    "cross",           # Lq != Lk
    "mask_with_causal",
    "lse",             # returns the log-sum-exp
    "weights",         # returns the attention weights
    "grads",           # returns dq, dk, dv
    "dbias",           # returns dbias
    "dropout",
    "noncontiguous",
    "broadcast_kv",
    "window_top_left",     # sliding window (ATTN-WIN-*), aligned top-left
    "window_bottom_right",  # sliding window aligned bottom-right (flash-attention's)
    "softcap",         # logit soft-capping (ATTN-CAP-*)
    "alibi",           # ALiBi slopes (ATTN-ALIBI-*), distances from the bottom-right diagonal (flash-attention's)
    "alibi_top_left",  # ALiBi with distances from the top-left diagonal (window_align="top_left")
    "sinks",           # per-head attention-sink logits (ATTN-SINK-*)
    "chunk_bottom_right",  # chunked local attention (ATTN-CHUNK-*), chunks of key positions from key 0,
    "chunk_top_left",      # the query placed by the bottom-right (flash-attention 3's) or top-left diagonal
    # Convention-level features (adapters/conventions): how the problem reaches the kernel.
    "varlen",          # packed variable-length batch: cu_seqlens (ATTN-VARLEN-*)
    "paged",           # paged KV cache: block_table into physical blocks (ATTN-PAGED-1, -2)
    "kvcache_append",  # new k/v written into the cache in place and attended to (ATTN-PAGED-3)
    "sparse_indices",  # keys chosen by top-k index lists, -1 = invalid (ATTN-SPARSE-*, flashmla_sparse)
    "latent",          # MLA's absorbed form: V is a prefix of the key's latent row (ATTN-MLA-1, flashmla_*)
})

# ---- outcomes ---------------------------------------------------------------------------------
FAILING = ("fail", "error", "crashed", "timeout")        # record statuses that fail a clause
CELL_STATES = ("failing", "divergent", "below_floor", "not_run", "conformant", "unsupported")
PROFILES = ("dev", "ci", "thorough")                     # Hypothesis profiles; ci certifies
