"""Logit soft-capping (ATTN-CAP-1..3): c tanh(x / c) of the scaled logits, before ALiBi, bias and masks.

Kernels get the cap wrong in three ways: they ignore it (sgl-project/sglang#33915), they apply it at
the wrong place (to the biased or masked logits, which bounds ALiBi and turns a mask's -inf into -c),
or they forget its derivative. Beyond agreement with the reference: the weights of a capped row are
bounded whatever the logits (ATTN-CAP-2), a cap far above the logits is no cap, a cap with ALiBi equals
the cap with ALiBi's explicit bias added after it, and the gradients carry tanh'.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import math

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, expect_equivalent, for_cases, judge, run
from attnconf.conformance.engine.tolerance import judge_gradients, judge_output
from attnconf.reference import oracle


@clauses("ATTN-CAP-1")
@for_cases(st.softcap_cases(), weight=0.6,
           examples=[st.fixed_case(71, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, softcap=0.8, regime="large"),
                     st.fixed_case(72, Lq=6, Lk=11, Dk=8, softcap=2.0, dtype="bfloat16", causal="bottom_right")], needs=("softcap",))
def test_softcap_matches_reference(impl, case):
    """A capped case (c from 0.05 to 3 times the largest scaled logit) agrees with the reference."""
    res = run(impl, case)
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-CAP-1")


@clauses("ATTN-CAP-2", "ATTN-PROP-13")
@for_cases(st.softcap_probe_cases(), weight=0.4, needs=("softcap",))
def test_capped_weights_are_bounded(impl, case):
    """Logits up to ~1e3, cap c <= 1, V = I: the output is finite and every visible weight of a row with n
    visible keys lies in [exp(-2c)/n, exp(2c)/n], widened by the output tolerance."""
    res = run(impl, case)
    expect(bool(np.isfinite(res.out).all()), "ATTN-CAP-2", "non-finite output with capped logits", case, impl)
    a = judge_output(res.out, case).allowed_max
    vis = oracle(case).visible
    n = vis.sum(axis=-1, keepdims=True)
    c = case.softcap
    lo = np.where(vis, math.exp(-2 * c) / np.maximum(n, 1) - a, -np.inf)
    hi = np.where(vis, math.exp(2 * c) / np.maximum(n, 1) + a, np.inf)
    w = res.out                                  # V = I: the output row is the weight row
    bad = np.argwhere(vis & ((w < lo) | (w > hi)))
    if bad.size:
        i = tuple(int(x) for x in bad[0])
        expect(False, "ATTN-CAP-2", f"weight {w[i]:.4g} at {i} outside [{lo[i]:.4g}, {hi[i]:.4g}] although every "
               f"capped logit lies in (-{c:g}, {c:g}): is the cap applied?", case, impl)
    expect_close(res.out, case, impl, clause="ATTN-CAP-2")


@clauses("ATTN-CAP-2")
@for_cases(st.cases(max_len=65), weight=0.3, needs=("softcap",))
def test_a_cap_far_above_the_logits_is_no_cap(impl, case):
    """c = 1e4 times the largest scaled logit (at least 1e4): the same output as no cap, within tolerance."""
    top = max(st._scaled_logit_max(case), 1.0)
    expect_equivalent(impl, case, case.replace(softcap=1e4 * top), clause="ATTN-CAP-2",
                      what="cap 1e4 x max|logit| vs no cap")


@clauses("ATTN-CAP-1", "ATTN-ALIBI-2")
@for_cases(st.softcap_cases(max_len=33, alibi=False, windows=False), weight=0.3,
           needs=("softcap", "alibi|alibi_top_left", "bias"))
def test_cap_comes_before_alibi_and_the_bias(impl, case):
    """Capped ALiBi equals the capped case with ALiBi's explicit bias, both added after the cap: a kernel that
    caps the biased logits (bounding ALiBi to (-c, c)) fails here, as one that caps a mask's -inf fails the
    reference comparison."""
    rng = np.random.default_rng(case.seed)
    s = case.shape
    slopes = rng.uniform(0.1, 1.0, (s["Hq"],))
    with_alibi = case.replace(alibi_slopes=slopes, window_align=("bottom_right", "top_left")[case.seed % 2])
    expect_equivalent(impl, with_alibi, st.alibi_as_bias(with_alibi), clause="ATTN-CAP-1",
                      what="capped logits + ALiBi vs capped logits + its explicit bias")


@clauses("ATTN-CAP-3", "ATTN-GRAD-1", "ATTN-TOL-5")
@for_cases(st.softcap_cases(grad=True, max_len=33), weight=0.4, needs=("softcap", "grads"))
def test_softcap_gradients(impl, case):
    """dQ and dK carry the cap's derivative 1 - tanh^2(x / c); dV (and dBias) agree with the float64 backward."""
    res = run(impl, case, grads=True)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)
