"""`torch.compile(torch.nn.functional.scaled_dot_product_attention)` (inductor, CPU) in the SDPA convention.

The compiled function is the documented SDPA itself, so its declaration is SDPA's. `dynamic=True`
asks for one graph per guard set instead of one per shape (a recompile per drawn shape would cost
seconds each on this machine); `torch._dynamo.config.cache_size_limit` is raised so that a long
run keeps compiling instead of silently falling back to eager after eight recompiles.
"""
from __future__ import annotations

import torch
import torch._dynamo
import torch.nn.functional as F

torch._dynamo.config.cache_size_limit = 256
_compiled = torch.compile(F.scaled_dot_product_attention, dynamic=True, fullgraph=True)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _compiled(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, enable_gqa=enable_gqa)
