"""sageattention 1.0.6's `sageattn` with its in-place `k -= km` kept off the caller's tensor (SAGEATTN-SMOOTH-K-
MUTATES-K): the same call on a copy of k, so the suite can look past ATTN-OP-8 at what the kernel computes.
Run it as --kernel=reports.sageattention.sageattn_k_copied:sageattn --convention=sageattn."""
from sageattention import sageattn as _upstream


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
    return _upstream(q, k.clone(), v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                     smooth_k=smooth_k, **kwargs)
