"""Decode (ATTN-DECODE-1): one query (Lq = 1) against a long key/value history.

Serving kernels specialise this shape (split-KV over the history, GQA heads packed into the query
block), so it gets its own strategy: Lk up to 4096 in every run, up to 32768 with --long; GQA groups
up to 8; per-sequence kv lengths; bottom-right alignment (the query on the last key), windows,
softcap, ALiBi and sinks. At Lq = 1 the dense reference costs O(Lk) and is used directly (the tiled
reference agrees with it to 1e-12: tests/test_reference_tiled_variants.py).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, judge, lse_need, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_lse
from attnconf.reference import Case


@clauses("ATTN-DECODE-1", "ATTN-WIN-2", "ATTN-GQA-1")
@for_cases(st.decode_cases(), weight=0.6,
           examples=[st.fixed_case(101, B=2, Hq=8, Hkv=1, Lq=1, Lk=1024, Dk=64, causal="bottom_right",
                                   kv_lengths=[1024, 513], window=(255, 0), dtype="bfloat16"),
                     st.fixed_case(102, Hq=4, Hkv=2, Lq=1, Lk=4096, Dk=32, dtype="float16", softcap=5.0,
                                   alibi_slopes=2.0 ** -np.arange(1.0, 5.0), sinks=np.array([0.0, 1.0, 2.0, 3.0]))])
def test_decode_matches_reference(impl, case):
    """Lq = 1 against Lk up to 4096 (GQA, per-sequence lengths, window, softcap, ALiBi, sinks) agrees with the
    reference, output and (where returned) lse."""
    res = run(impl, case, need=lse_need(impl, case))
    expect_close(res.out, case, impl, clause="ATTN-DECODE-1")
    if res.lse is not None:
        judge(judge_lse(res.lse, case), case, impl, "ATTN-DECODE-1")


LONG_DECODE = (8192, 16384, 32768)


@clauses("ATTN-DECODE-1", "ATTN-LONG-1")
@pytest.mark.parametrize("length", LONG_DECODE)
def test_decode_long(impl, length):
    """--long: Lq = 1 against 8192, 16384 and 32768 keys, every variant on, in each dtype the kernel runs."""
    if not impl.session.long:
        pytest.skip("long-sequence mode is off (run with --long)")
    rng = np.random.default_rng(length)
    d, hq = 64, 4
    for dtype in ("bfloat16", "float16", "float32", "float64"):
        q, k, v = rng.normal(size=(1, hq, 1, d)), rng.normal(size=(1, 2, length, d)), rng.normal(size=(1, 2, length, d))
        case = Case.build(q, k, v, dtype=dtype, seed=length, causal="bottom_right", window=(length // 2, 0),
                          softcap=6.0, alibi_slopes=2.0 ** (-12.0 - np.arange(hq)), sinks=rng.normal(size=hq))
        fitted = fit(case, impl)        # a kernel without ALiBi or sinks still gets its long decode
        target = fitted if fitted is not None else case
        res = run(impl, target)
        if res is not None:
            expect_close(res.out, target, impl, clause="ATTN-DECODE-1")
