"""The multi-head attention layer (ATTN-MHA-1): projections, per-head attention, concat, W_O.

Layer implementations (torch nn.MultiheadAttention, Keras MultiHeadAttention,
flax nnx) are loaded with the spec's weights and compared with
`reference.layer.mha` under the tolerance model.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import numpy as np
from hypothesis import strategies as hst

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, for_cases, judge, run_layer
from attnconf.conformance.engine.tolerance import judge_layer
from attnconf.reference.layer import random_layer_case


@hst.composite
def layer_cases(draw):
    heads = draw(hst.sampled_from((1, 2, 4)))
    e = heads * draw(hst.sampled_from((2, 4, 8, 16)))
    lq, lk = draw(hst.sampled_from((1, 3, 7, 16))), draw(hst.sampled_from((1, 4, 9, 16)))
    b = draw(hst.sampled_from((1, 2)))
    dtype = draw(st.dtype_choice())
    masked = draw(hst.sampled_from((None, "random", "empty_row")))
    causal = draw(hst.sampled_from((None, "top_left"))) if lq == lk else None
    rng = np.random.default_rng(draw(hst.integers(0, 2**32 - 1)))
    mask = masked
    if masked == "empty_row":
        mask = rng.random((b, lq, lk)) < 0.7
        mask[:, int(rng.integers(lq)), :] = False
    return random_layer_case(rng, b, lq, lk, e, heads, dtype=dtype, biases=draw(hst.booleans()), mask=mask,
                             causal=causal)


@clauses("ATTN-MHA-1")
@for_cases(layer_cases(), fixture="layer_impl", weight=1)
def test_layer_matches_reference(layer_impl, case):
    """The layer equals projections + per-head attention + concatenation + output projection."""
    out = run_layer(layer_impl, case)
    judge(judge_layer(out, case), case, layer_impl)
