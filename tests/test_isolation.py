"""IsolatedAdapter contains every hostile kernel: each becomes one exception with a one-line reason.

The hostile kernels run under the numpy backend (its worker starts in about a
second); one test repeats the crash-and-restart cycle under torch.
"""
from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from attnconf.adapters import UsageError
from attnconf.adapters.base import KernelError
from attnconf.adapters.isolated import IsolatedAdapter, KernelCrashed
from attnconf.reference import Case
from tests.kernels import hostile

TIMEOUT_S = 3.0
MEMORY = 256 << 20


def make_case(lk: int = 8, seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 5, 8), (1, 2, lk, 8), (1, 2, lk, 8)))
    return Case.build(q, k, v, dtype="float32")


def isolated(kernel: str, backend: str = "numpy") -> IsolatedAdapter:
    return IsolatedAdapter({"backend": backend, "kernel": f"tests.kernels.hostile:{kernel}"},
                           timeout_s=TIMEOUT_S, memory_bytes=MEMORY)


# kernel -> (exception type or None for a returned Result, status, substring of the message)
OUTCOMES = {
    "segfault": (KernelCrashed, "crashed", "killed by signal SIGSEGV"),
    "hang": (KernelCrashed, "timeout", f"no answer after {TIMEOUT_S:g} s"),
    "hang_if_long_queries": (KernelCrashed, "timeout", f"no answer after {TIMEOUT_S:g} s"),   # make_case has Lq = 5
    "alloc_unbounded": (KernelCrashed, "crashed", "out of memory (limit 0.25 GiB)"),
    "raises_always": (KernelError, None, "kernel raised RuntimeError: hostile kernel refuses to run"),
    "returns_list": (KernelError, None, "returned list, not an array"),
    "mutates_inputs": (KernelError, None, "mutated its input `query`"),
    "returns_nan": (None, None, None),
    "wrong_shape": (None, None, None),
}


def test_every_hostile_kernel_has_an_expected_outcome():
    kernels = {n for n in vars(hostile) if not n.startswith("_") and callable(getattr(hostile, n))
               and getattr(getattr(hostile, n), "__module__", "") == hostile.__name__}
    # mutates_mask needs a float mask, which make_case lacks: tests/test_hostile_suite.py runs it
    assert kernels - {"segfault_if_long", "mutates_mask"} == set(OUTCOMES)


@pytest.mark.parametrize("kernel", sorted(OUTCOMES))
def test_hostile_kernel_outcome(kernel):
    exc_type, status, text = OUTCOMES[kernel]
    adapter = isolated(kernel)
    case = make_case()
    try:
        t0 = time.perf_counter()
        if exc_type is None:
            res = adapter.run(case)  # garbage passes through; the suite's checks judge it
            if kernel == "returns_nan":
                assert res.out.shape == case.out_shape and np.isnan(res.out).all()
            else:
                assert res.out.shape != case.out_shape
            return
        with pytest.raises(exc_type) as info:
            adapter.run(case)
        elapsed = time.perf_counter() - t0
        message = str(info.value)
        assert text in message and "\n" not in message
        if exc_type is KernelCrashed:   # restarting after a crash: test_next_call_after_a_crash_works
            assert info.value.status == status
            assert case.summary() in message
            assert elapsed < TIMEOUT_S + 3
        else:                           # the kernel's own error leaves the worker serving
            assert not isinstance(info.value, KernelCrashed)
            with pytest.raises(exc_type):
                adapter.run(case)
            assert adapter.restarts == 0
    finally:
        adapter.close()


def test_next_call_after_a_crash_works():
    adapter = isolated("segfault_if_long")
    try:
        with pytest.raises(KernelCrashed, match="SIGSEGV") as info:
            adapter.run(make_case(lk=hostile.LONG + 1))
        assert info.value.status == "crashed"
        res = adapter.run(make_case(lk=8))
        assert res.out.shape == (1, 2, 5, 8) and np.isfinite(res.out).all()
        assert adapter.restarts == 1
    finally:
        adapter.close()


def test_declaration_is_copied_and_supports_runs_in_the_parent():
    adapter = isolated("segfault_if_long")
    try:
        assert adapter.name == "numpy:kernel:tests.kernels.hostile:segfault_if_long"
        assert adapter.backend == "numpy" and adapter.trusted is False and "mask" in adapter.capabilities
        assert adapter.memory_cap > 0
        adapter._kill()                       # no worker: supports() must not need one
        assert adapter.supports(make_case()) is True
        assert adapter.describe()["isolated"] is True
    finally:
        adapter.close()


def test_worker_start_failure_is_a_usage_error():
    with pytest.raises(UsageError, match="has no attribute"):
        isolated("no_such_kernel")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_worker_crash_and_restart():
    adapter = isolated("segfault_if_long", backend="torch")
    try:
        with pytest.raises(KernelCrashed, match="SIGSEGV"):
            adapter.run(make_case(lk=hostile.LONG + 1))
        res = adapter.run(make_case(lk=8))
        assert res.out.shape == (1, 2, 5, 8) and res.out_dtype == "float32"
    finally:
        adapter.close()
