"""Long sequences against the float64 reference on sampled rows (ATTN-LONG-1) and memory growth (ATTN-PROP-7).

Both run only when asked (`--long`, `--measure-memory`): they take minutes. ATTN-LONG-1 runs every
dtype at lengths one past a power of two on inputs whose answer hangs on a few sharp keys, some far back
and some past position 16384 (conformance/strategies/long_cases.py), and judges the sampled rows (the boundaries and
the last rows among them) as every output is judged: against the float64 reference and the emulated
naive baseline at the case's dtype, both computed for those rows against all keys (reference/tiled.py's
rows_case: O(rows x L) memory, where the whole case's would be O(L^2)).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import contextlib
import tracemalloc

import numpy as np
import pytest

from attnconf.conformance.engine.harness import NoResult, clauses, judge, observe, run
from attnconf.conformance.strategies.long_cases import LONG_LENGTHS, long_case, sampled_rows
from attnconf.conformance.engine.tolerance import judge_output
from attnconf.reference import DTYPES, Case
from attnconf.reference.tiled import rows_case


@clauses("ATTN-LONG-1")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", LONG_LENGTHS)
def test_long_sequences(impl, length, dtype):
    """At long lengths the kernel's sampled rows are within the tolerance model of the float64 reference."""
    if not impl.session.long:
        pytest.skip("long-sequence mode is off (run with --long)")
    rng = np.random.default_rng(length)
    rows = sampled_rows(length, rng)
    case = long_case(length, dtype, rng, rows)
    res = run(impl, case)
    sub = rows_case(case, rows)
    got = np.asarray(res.out)[:, :, rows]
    j = judge_output(got, sub)
    observe(impl, "ATTN-LONG-1", f"max_error_L{length}_{dtype}", j.e_max, case)
    observe(impl, "ATTN-LONG-1", f"ratio_L{length}_{dtype}", j.ratio_max, case)
    if not j.ok and j.worst is not None:
        j.reason += f" (sampled row {int(rows[j.worst[2]])} of {length})"
    judge(j, case, impl, "ATTN-LONG-1")


@clauses("ATTN-PROP-7")
def test_memory_growth(impl):
    """Peak memory against L: fitted exponent about 2 for naive kernels, about 1 for tiled ones (recorded)."""
    if not impl.session.measure_memory:
        pytest.skip("memory measurement is off (run with --measure-memory)")
    lengths = (512, 1024, 2048, 4096)
    peaks = []
    _warm_up(impl)
    for n in lengths:
        rng = np.random.default_rng(n)
        case = Case.build(*(rng.normal(size=(1, 1, n, 64)) for _ in range(3)), dtype="float32")
        if impl.supports(case) is not True:
            pytest.skip(f"{impl.name} cannot run the memory cases")
        peaks.append(_peak_bytes(impl, case))
    slope = float(np.polyfit(np.log(lengths), np.log(np.maximum(peaks, 1)), 1)[0])
    observe(impl, "ATTN-PROP-7", "memory_exponent", round(slope, 2))
    observe(impl, "ATTN-PROP-7", "peak_bytes", dict(zip(map(str, lengths), map(int, peaks))))


def _warm_up(impl) -> None:
    """One small call first, so one-time allocations (thread pools, kernel caches) are not counted."""
    rng = np.random.default_rng(0)
    with contextlib.suppress(NoResult):       # a warm-up: whether it runs is the memory cases' to say
        run(impl, Case.build(*(rng.normal(size=(1, 1, 256, 64)) for _ in range(3)), dtype="float32"))


def _peak_bytes(impl, case) -> float:
    if impl.session.device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run(impl, case)
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    # CPU: tracemalloc sees NumPy kernels; torch's allocator is invisible to it, so also take the
    # growth of the process's peak RSS over the resident size before the call (lengths increase,
    # so each call's peak is a new high-water mark).
    import resource

    with open("/proc/self/statm") as f:
        resident_before = int(f.read().split()[1]) * resource.getpagesize()
    tracemalloc.start()
    run(impl, case)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0 - resident_before
    return float(max(peak, rss))
