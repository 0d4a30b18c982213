"""What conformance tests call: run a case, judge a result, record what was seen (the suite's one import).

Tests read as statements of the spec. The implementation a test receives is a `Subject`: the adapter under
test bound to the test's own `TestRecord` and to the run's `Session` (both owned by the plugin, which keeps
the session on `config.stash`), so nothing here lives in module globals and a Hypothesis test can report
"unsupported", "divergent as declared" or the exact failing case without bookkeeping of its own.

This module is the face; the engine behind it is, in the order data flows:

- conformance/engine/session.py: Session, TestRecord, Subject, observe, record_panel;
- conformance/engine/outcomes.py: how a call or an example ends without a result to judge (Unsupported,
  RaisedAsDeclared) or with a verdict (ConformanceFailure, KernelAborted);
- conformance/engine/kernel_call.py: `invoke`, the one call path into a kernel, and `run` / `run_layer`,
  which judge the output contract and the declared divergences' covered elements (covered.py);
- conformance/engine/judging.py: `judge` and the `expect*` statements;
- conformance/engine/drawing.py: the test decorators (`clauses`, `first`, `for_cases`) and how many cases
  a cell draws.
"""
from __future__ import annotations

from attnconf.conformance.engine.covered import Exempt, by_specificity, precision_of
from attnconf.conformance.engine.drawing import (MIN_CELL_EXAMPLES, OFFER_DRAWS, RAISES_DRAWS, TOP_UP_DRAWS,
                                                 TOP_UPS, cell_body, cell_minimum, clauses, database_key, first,
                                                 for_cases, refused_at_once, scope_of, subject_credit,
                                                 subject_shortfall)
from attnconf.conformance.engine.judging import (SPECIFIC_TAGS, expect, expect_agree, expect_close,
                                                 expect_equivalent, expect_raises, judge, reference_gap)
from attnconf.conformance.engine.kernel_call import invoke, lse_need, run, run_layer
from attnconf.conformance.engine.outcomes import (ConformanceFailure, KernelAborted, KernelTimeout, NoResult,
                                                  RaisedAsDeclared, Unsupported)
from attnconf.conformance.engine.session import (KEEP_OUTPUTS, MAX_SAMPLES, Session, Subject, TestRecord, observe,
                                                 record_panel, worst)

__all__ = [
    "Exempt", "by_specificity", "precision_of",
    "MIN_CELL_EXAMPLES", "OFFER_DRAWS", "RAISES_DRAWS", "TOP_UP_DRAWS", "TOP_UPS", "cell_body", "cell_minimum",
    "clauses", "database_key", "first", "for_cases", "refused_at_once", "scope_of", "subject_credit",
    "subject_shortfall",
    "SPECIFIC_TAGS", "expect", "expect_agree", "expect_close", "expect_equivalent", "expect_raises", "judge",
    "reference_gap",
    "invoke", "lse_need", "run", "run_layer",
    "ConformanceFailure", "KernelAborted", "KernelTimeout", "NoResult", "RaisedAsDeclared", "Unsupported",
    "KEEP_OUTPUTS", "MAX_SAMPLES", "Session", "Subject", "TestRecord", "observe", "record_panel", "worst",
]
