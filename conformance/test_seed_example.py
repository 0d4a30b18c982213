"""The worked example of the seed documents, through the implementation (ATTN-SEED-1).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import tomllib
from pathlib import Path

import numpy as np

from attnconf.conformance.engine.harness import NoResult, clauses, expect, judge, run
from attnconf.conformance.engine.tolerance import judge_output
from attnconf.reference import Case

EXAMPLE = tomllib.loads((Path(__file__).parent.parent / "spec" / "seed_example.toml").read_text())["example"]


@clauses("ATTN-SEED-1", "ATTN-OP-1")
def test_seed_worked_example(impl):
    """Three tokens, d_k = 2: the implementation reproduces the corrected figures."""
    q, k, v = (np.array(EXAMPLE[n], dtype=np.float64)[None, None] for n in ("q", "k", "v"))
    want = np.array(EXAMPLE["expected"]["output"])
    for dtype in ("float64", "float32"):
        case = Case.build(q, k, v, dtype=dtype)
        try:
            res = run(impl, case)
        except NoResult:                  # recorded; the figures are checked in the next dtype it runs
            continue
        judge(judge_output(res.out, case), case, impl)
        expect(np.abs(res.out[0, 0] - want).max() <= 5e-4, "ATTN-SEED-1",
               f"output {np.round(res.out[0, 0], 4).tolist()} != seed figures {want.tolist()}", case, impl)
        return
