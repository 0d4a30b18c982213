"""The accuracy contract of an approximate kernel (ATTN-QUANT-1..3, SPEC section 29).

A kernel that declares a quantization scheme or an accuracy class (or whose convention holds it to a
default scheme: sageattn) has its outputs judged by that contract in `harness.run`, on every call of
every test (conformance/engine/alternatives_contracts.py): this test gives the contract its own cells, on
ordinary cases of every shape the kernel declares. For an exact kernel it is one more agreement test.
A NaN or inf where the contract's reference is finite fails, whatever the declared accuracy.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_close, for_cases, lse_need, run


@clauses("ATTN-QUANT-1", "ATTN-QUANT-2", "ATTN-QUANT-3")
@for_cases(st.cases(max_len=65), weight=0.3,
           examples=[st.fixed_case(264, B=1, Hq=2, Hkv=1, Lq=130, Lk=70, Dk=64, dtype="float16"),
                     st.fixed_case(265, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, dtype="bfloat16")])
def test_contract_holds(impl, case):
    """The output (and lse) meets the kernel's contract (for a kernel without one: the spec's tolerance)."""
    res = run(impl, case, need=lse_need(impl, case))
    if res is not None:
        expect_close(res.out, case, impl, clause="ATTN-QUANT-1")
