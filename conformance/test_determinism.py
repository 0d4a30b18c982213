"""Bitwise-identical reruns (ATTN-DET-1), checked by default.

The same call on the same inputs in the same process must return the same bits, forward and backward:
training that cannot be replayed cannot be debugged, and a kernel that races (atomics in a split-KV
reduction, a summation order that follows thread timing) has lost it in real releases.
flash-attention's own tests rerun 50 to 1000 times on a GPU, where races are rare events. Here each
example is run once and then RERUNS more times, compared bit for bit (NaN equals NaN): the ci profile's
examples over the four dtypes give about a hundred reruns per implementation, the low end of that
range, at five calls per example; a defect that shows on a fraction f of calls is seen with
probability 1 - (1 - f)^100 (63% at f = 1%, 99% at f = 5%), and one that shows on every call (an order
drawn per call) at once. A dropout case keeps its seed, so its mask must repeat as well, where the adapter
hands that seed to the kernel (`Adapter.seeds_dropout`: torch's generator is seeded per call; the SDPA
convention on NumPy arrays has no channel for a seed, so its kernels are rerun without dropout).

A kernel that declares `deterministic = false` (adapters/scope.py) is not failed: the spread of its
reruns is recorded all the same (the largest |difference| over the reruns, `rerun_spread`), and its
certificate says it is declared nondeterministic.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, for_cases, observe, run
from attnconf.conformance.engine.nan_aware import max_gap

RERUNS = 4
DROPOUT_P = 0.25


def _arrays(res) -> dict[str, np.ndarray]:
    out = {"out": np.asarray(res.out)}
    if res.lse is not None:
        out["lse"] = np.asarray(res.lse)
    for name, g in (res.grads or {}).items():
        if g is not None:
            out[name] = np.asarray(g)
    return out


@clauses("ATTN-DET-1")
@for_cases(st.cases(grad=True, max_len=65, layouts=False), weight=0.3)
def test_reruns_are_bitwise_identical(impl, case):
    """RERUNS more calls on the same case return the first call's output, lse and gradients bit for bit."""
    rng = np.random.default_rng(case.seed)
    if "dropout" in impl.capabilities and impl.seeds_dropout and rng.random() < 0.25:
        case = case.replace(dropout_p=DROPOUT_P)
    grads = "grads" in impl.capabilities
    first = run(impl, case, grads=grads)
    want = _arrays(first)
    spread, differs = 0.0, []
    for r in range(1, RERUNS + 1):
        again = run(impl, case, grads=grads)
        got = _arrays(again)
        for name, a in want.items():
            b = got.get(name)
            if b is None or b.shape != a.shape:
                differs.append(f"rerun {r} returned no {name} of shape {a.shape}")
                continue
            spread = max(spread, max_gap(a, b))
            if not np.array_equal(a, b, equal_nan=True):
                differs.append(f"rerun {r}: {name} differs in {int((~((a == b) | (np.isnan(a) & np.isnan(b)))).sum())} "
                               f"of {a.size} entries")
    observe(impl, "ATTN-DET-1", "rerun_spread", spread, case)
    if not impl.deterministic:
        return
    expect(not differs, "ATTN-DET-1", f"{len(differs)} of {RERUNS} reruns x {len(want)} arrays differ from the first "
           f"call (max |difference| {spread:.3g}); first: {differs[0] if differs else ''}", case, impl)
