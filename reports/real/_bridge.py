"""Array conversion shared by the wrappers: torch tensors in, NumPy out and back, exactly.

Every input attnconf passes is already rounded to its dtype, so going through float32 for
bfloat16 (NumPy has no bfloat16) loses nothing.
"""
from __future__ import annotations

import numpy as np
import torch


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of `t` (bfloat16 widened to float32, exactly)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous().numpy().copy()


def to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """`a` as a torch tensor of `dtype` (the kernel's own output dtype is kept when it differs:
    the suite checks the output dtype, ATTN-OP-5)."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def top_left_causal(lq: int, lk: int) -> np.ndarray:
    """The (Lq, Lk) bool mask of torch's is_causal (top-left: query i sees keys j <= i)."""
    return np.tril(np.ones((lq, lk), dtype=bool))
