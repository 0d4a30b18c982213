"""flash-attn-triton 0.1.1's `flash_attn_func` (a Triton flash-attention kernel behind the
flash-attention 2 API) run on CPU tensors through Triton 3.3.1's interpreter (`TRITON_INTERPRET=1`).

Triton 3.3.1 is the newest release that still has what the package uses
(`triton.tools.experimental_descriptor`, block pointers). One accommodation, which does not touch
what the kernel computes: the forward kernel is `@triton.autotune`d over its block
configurations, and the interpreter has no driver to time them. The autotuner is therefore pruned
to one of the package's own configurations (BLOCK_M 128, BLOCK_N the largest of 64, 32, 16 that
the kernel's `tl.static_assert(BLOCK_N <= HEAD_DIM)` allows, 4 warps, 3 stages; a GPU's
autotuner discards the configurations failing that assertion and times the rest, every one
computing the same function), and its timing function returns a constant instead of timing.

`flash_attn_func` is exported as it is, for `--convention=flash_attn`.
"""
from __future__ import annotations

import functools
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise ImportError("set TRITON_INTERPRET=1: this wrapper runs the Triton kernel on CPU tensors")

import triton  # noqa: E402


def _untimed(kernel_call, quantiles=None, **kwargs):
    return [0.0, 0.0, 0.0]


triton.autotune = functools.partial(triton.autotune, do_bench=_untimed)

from flash_attn_triton import flash_attn_func  # noqa: E402
from flash_attn_triton.triton_kernel import attention_kernel as _kernel  # noqa: E402


def _one_config(configs, named_args, **kwargs):
    block_n = max(n for n in (16, 32, 64) if n <= kwargs["HEAD_DIM"])
    return [c for c in configs if c.kwargs == {"BLOCK_M": 128, "BLOCK_N": block_n}
            and c.num_warps == 4 and c.num_stages == 3][:1]


_kernel._attn_fwd.early_config_prune = _one_config

__all__ = ["flash_attn_func"]
