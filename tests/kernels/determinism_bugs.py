"""Kernels whose reruns differ: the catalogue of ATTN-DET-1.

`random_key_order` is `tests.kernels.correct.naive` with the keys visited in a fresh random order on
every call, as a split-KV kernel whose partial results are combined in the order their thread blocks
finish: each call is accurate (softmax and the weighted sum do not depend on the order of the keys),
but the float32 sums round differently from call to call. Its order comes from the operating system's
entropy, not from torch's generator, which adapters seed per call. `random_key_order_declared` is the
same kernel declaring `deterministic = false`: the suite records its spread and passes it.
"""
from __future__ import annotations

import numpy as np
import torch

from .correct import naive


def random_key_order(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """Defect: the keys are summed in a new random order on each call. Trips ATTN-DET-1."""
    lq, lk = query.shape[-2], key.shape[-2]
    perm = torch.from_numpy(np.random.default_rng().permutation(lk))
    mask = attn_mask
    if is_causal:                                   # the causal mask moves with the keys: make it explicit
        causal = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril()
        if mask is None:
            mask = causal
        elif mask.dtype == torch.bool:
            mask = mask & causal
        else:
            mask = mask.masked_fill(~causal, -float("inf"))
    if mask is not None:
        mask = mask.broadcast_to((*mask.shape[:-1], lk))[..., perm]
    return naive(query, key[..., perm, :], value[..., perm, :], mask, dropout_p, False, scale, enable_gqa)


random_key_order.clause = "ATTN-DET-1"
BUGS = {"random_key_order": random_key_order}


def random_key_order_declared(*args, **kwargs):
    """The same kernel, declared nondeterministic: its reruns' spread is recorded, not failed."""
    return random_key_order(*args, **kwargs)


random_key_order_declared.attnconf_capabilities = {"deterministic": False}
