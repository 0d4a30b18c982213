"""Long sequences against the tiled float64 reference (ATTN-LONG-1) and memory growth (ATTN-PROP-7).

Both run only when asked (`--long`, `--measure-memory`): they take minutes, and
the dense reference cannot reach these lengths at all.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import tracemalloc

import numpy as np
import pytest

from attnconf.conformance.harness import clauses, expect, observe, run
from attnconf.conformance.tolerance import rounding_noise
from attnconf.reference import Case
from attnconf.reference.tiled import tiled_forward

LONG_LENGTHS = (4096, 16384, 32768)
SAMPLED_ROWS = 64


@clauses("ATTN-LONG-1")
@pytest.mark.parametrize("length", LONG_LENGTHS)
def test_long_sequences(impl, length):
    """At long lengths the kernel still agrees with the tiled float64 reference on sampled rows."""
    if not impl.session.long:
        pytest.skip("long-sequence mode is off (run with --long)")
    rng = np.random.default_rng(length)
    d = 64
    for dtype in ("bfloat16", "float16", "float32"):
        q, k, v = (rng.normal(size=(1, 1, length, d)) for _ in range(3))
        case = Case.build(q, k, v, dtype=dtype, causal="top_left", seed=length)
        res = run(impl, case)
        if res is None:
            continue
        rows = np.sort(rng.choice(length, SAMPLED_ROWS, replace=False))
        out_ref, _ = tiled_forward(case.q, case.k, case.v, causal="top_left")
        # No emulated baseline at this length: the floor alone, widened by the row's rounding growth sqrt(L).
        got, want = res.out[0, 0, rows], out_ref[0, 0, rows]
        allowed = 2.0 * np.sqrt(length) * rounding_noise(want, dtype).max()
        err = float(np.abs(got - want).max())
        expect(np.isfinite(got).all(), "ATTN-LONG-1", f"non-finite output at L={length}", case, impl)
        observe(impl, "ATTN-LONG-1", f"max_error_L{length}_{dtype}", err, case)
        expect(err <= allowed, "ATTN-LONG-1", f"L={length} {dtype}: max error {err:.3g} > {allowed:.3g}", case, impl)
        return


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
