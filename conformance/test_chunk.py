"""Chunked local attention (ATTN-CHUNK-1, -2): flash-attention 3's attention_chunk, as Llama 4 uses it.

The keys are cut into chunks of C positions counted from key 0; a query sees the keys of the chunk that
holds its aligned position, and causal masking or a window narrows that further. Chunk bugs are
boundary bugs (a chunk one key too long, chunks counted from the query's first row instead of key 0
when Lq != Lk); the fixed examples put chunk boundaries inside the rows, with Lq != Lk and causal.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, judge, lse_need, run
from attnconf.conformance.engine.tolerance import judge_lse

NEEDS = ("chunk_top_left|chunk_bottom_right",)


@clauses("ATTN-CHUNK-1", "ATTN-CHUNK-2")
@for_cases(st.chunk_cases(), weight=0.6, needs=NEEDS,
           examples=[st.fixed_case(261, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, chunk=4),
                     st.fixed_case(262, Lq=13, Lk=13, Dk=8, chunk=5, causal="bottom_right", dtype="float16"),
                     st.fixed_case(263, Lq=5, Lk=11, Dk=8, chunk=3, causal="bottom_right", dtype="bfloat16")])
def test_chunk_matches_reference(impl, case):
    """A chunked case (any chunk size, with or without causal) agrees with the reference, lse included."""
    res = run(impl, case, need=lse_need(impl, case))
    clause = "ATTN-CHUNK-2" if case.causal is not None or case.window is not None else "ATTN-CHUNK-1"
    expect_close(res.out, case, impl, clause=clause)
    if res.lse is not None:
        judge(judge_lse(res.lse, case), case, impl, clause)

