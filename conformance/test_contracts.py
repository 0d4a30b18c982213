"""The calling contract: shape, dtype, invalid input, determinism (ATTN-OP-2, -5, -6, -7).

`harness.run` already checks shape and dtype on every call of every test; this
module states the contract on its own so a failure names it directly.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import numpy as np
import pytest

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect_raises, for_cases, observe, run
from attnconf.conformance.engine.scope_fit import declared_lengths


@clauses("ATTN-OP-2", "ATTN-OP-5")
@for_cases(st.cases(max_len=65), weight=1)
def test_output_shape_and_dtype(impl, case):
    """The output is (B, Hq, Lq, Dv) in the input dtype."""
    run(impl, case)


INVALID = {
    "batch mismatch": ((2, 2, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8)),
    "Dk mismatch": ((1, 2, 4, 8), (1, 2, 5, 6), (1, 2, 5, 8)),
    "Hq not a multiple of Hkv": ((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)),
    "K and V lengths differ": ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8)),
}


@clauses("ATTN-OP-6")
@pytest.mark.parametrize("problem", sorted(INVALID))
def test_invalid_shapes_raise(impl, problem):
    """Invalid shapes raise instead of returning a result."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=s) for s in INVALID[problem])
    expect_raises(impl, q, k, v, problem)


@clauses("ATTN-OP-7")
def test_determinism_is_recorded(impl):
    """Repeated calls on the same input: bitwise identical or not (recorded, not judged)."""
    case = st.fixed_case(7, B=2, Hq=4, Hkv=2, Lq=33, Lk=65, Dk=64, dtype="float32", causal="bottom_right")
    case = declared_lengths(case, impl, frozenset())       # into a narrow kernel's declared limits, if any
    first = run(impl, case)
    same = all(np.array_equal(first.out, run(impl, case).out, equal_nan=True) for _ in range(3))
    observe(impl, "ATTN-OP-7", "bitwise_deterministic", "yes" if same else "no", case)
