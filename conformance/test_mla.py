"""MLA's absorbed form (ATTN-MLA-1): scores over all 576 dims of the latent row, V its first 512.

Runs where an implementation takes the latent form (`latent` in its scope: the `flashmla_kvcache`
and `flashmla_sparse` conventions, adapters/conventions/mla_latent.py). A case reaches such a
kernel either natively (Dk = 576, Dv = 512, V = K[..., :512]) or embedded: the key row is
[V | 0 | K at an offset | 0]. The offset is put at both ends here: right after V (K inside the
512 latent dims) and at the end (K in the 64 rope dims, when Dk <= 64), so a kernel that drops
the rope dims from the score, or reads V from another slice of the row, fails.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import Case

NEED = {"latent"}
D_QK, D_V = 576, 512


def native_case(seed: int, *, B=1, Hq=2, Lq=3, Lk=70, dtype="bfloat16", **params) -> Case:
    """The absorbed form itself: latent rows of 576 dims, V their first 512 (70 keys: a second page)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, 1, Lk, D_QK)) / 4
    q = rng.standard_normal((B, Hq, Lq, D_QK)) / 4
    return Case.build(q, k, k[..., :D_V].copy(), dtype=dtype, seed=seed, **params)


NATIVE = [native_case(1, Lq=1), native_case(2, B=2, Lq=4, Lk=65, causal="bottom_right", dtype="float16"),
          native_case(3, Lq=2, Lk=9, kv_lengths=[5], dtype="float32")]


@clauses("ATTN-MLA-1")
@for_cases(st.convention_cases(max_len=33), examples=NATIVE, weight=0.4, needs=("latent",))
def test_value_is_the_latent_prefix_and_scores_use_every_dim(impl, case):
    """The output is the reference's with K placed in the latent dims and, separately, in the rope dims
    (two calls; native cases run as they are)."""
    fitted = fit(case, impl, need=NEED)
    if fitted is None:
        run(impl, case, need=NEED)
        return
    s = fitted.shape
    native = s["Dk"] == D_QK and s["Dv"] == D_V
    offsets = [None] if native else sorted({s["Dv"], D_QK - s["Dk"]})
    for offset in offsets:
        c = fitted if offset is None else fitted.replace(packing={**fitted.packing, "latent_offset": offset})
        res = run(impl, c, need=NEED)
        expect_close(res.out, c, impl, clause="ATTN-MLA-1")
