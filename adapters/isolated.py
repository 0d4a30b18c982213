"""Run an adapter in a worker process, so a kernel that crashes, hangs or eats memory fails one test.

A third-party kernel runs in the test process by default; one segfault there
ends the whole run with no report. `IsolatedAdapter` builds the real adapter
inside a persistent worker (multiprocessing, 'spawn' context: no forked torch
or XLA state) from a picklable spec `{"backend", "device", "kernel", "impl",
"options", "convention", "capabilities"}` and forwards `run`, `run_raw` and `run_layer` to it. The parent
copies the inner adapter's declaration once at start-up, so `supports()` costs
nothing. Failures come back as exceptions:

- the worker died (signal or exit)  -> KernelCrashed(status="crashed")
- no answer within `timeout_s`      -> worker killed, KernelCrashed(status="timeout")
- allocation failed in the worker   -> KernelCrashed(status="crashed", "out of memory (limit N GiB)")
- KernelError in the worker         -> KernelError with the same message

A dead or killed worker is replaced on the next call. The worker's address
space is capped with RLIMIT_AS at (its size once the framework and adapter are
loaded) + `memory_bytes`: frameworks reserve large virtual ranges they never
touch (XLA, TensorFlow), so a fixed cap would kill them at import; the budget
is what the kernel may allocate on top.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import pickle
import signal
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Literal

from attnconf.reference import Case

from .base import Adapter, KernelError, Result

DEFAULT_MEMORY_BYTES = 4 << 30
DEFAULT_TIMEOUT_S = 60.0
START_TIMEOUT_S = 180.0
_DECLARATION = ("name", "backend", "devices", "dtypes", "capabilities", "max_head_dim", "head_dims", "max_seqlen",
                "convention", "scope_source", "kind", "trusted", "example_budget", "lse_dtypes", "requires", "contract", "accuracy_contract",
                "deterministic", "seeds_dropout", "expressible", "outside_convention")


class KernelCrashed(KernelError):
    """The kernel took its worker down: `status` is "crashed" or "timeout"."""

    def __init__(self, message: str, status: Literal["crashed", "timeout"] = "crashed"):
        super().__init__(message)
        self.status = status


class WorkerError(RuntimeError):
    """The worker failed outside the kernel (a suite or adapter bug); carries the worker's traceback."""


# ---- the worker side --------------------------------------------------------
def _out_of_memory(exc: BaseException | None) -> BaseException | None:
    """The allocation failure in an exception's cause chain, if there is one."""
    while exc is not None:
        if isinstance(exc, MemoryError):
            return exc
        text = str(exc).lower()
        if isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text
                                              or "bad_alloc" in text):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _address_space() -> int:
    """This process's virtual size in bytes (Linux), 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            import os  # noqa: PLC0415
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _cap_memory(budget: int) -> int:
    """Cap the address space at current size + budget; returns the cap (0 if not capped)."""
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:
        return 0
    cap = _address_space() + budget
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap


def _worker(conn, spec: dict[str, Any], memory_bytes: int) -> None:
    """Build the adapter, send its declaration, then answer requests until told to stop."""
    t0 = time.perf_counter()
    try:
        from attnconf import adapters  # noqa: PLC0415

        impl = spec.get("impl")
        found = adapters.load(spec["backend"], device=spec.get("device", "cpu"), kernel=spec.get("kernel"),
                              impl=impl, options=spec.get("options"), convention=spec.get("convention"),
                              capabilities=spec.get("capabilities"))
        pick = spec.get("pick") or impl
        inner = next((a for a in found if a.name == pick), found[0])
        decl = {name: getattr(inner, name, None) for name in _DECLARATION}
        decl["extra_support"] = type(inner).extra_support is not Adapter.extra_support
        # a calling convention decides support itself (requirements renamed, what it can express)
        decl["own_supports"] = (type(inner).supports is not Adapter.supports
                                or type(inner).requirements is not Adapter.requirements)
        decl["scope"] = inner.scope()
        decl["describe"] = inner.describe()
        decl["startup_s"] = time.perf_counter() - t0
        decl["memory_cap"] = _cap_memory(memory_bytes) if memory_bytes else 0
        conn.send(("ok", decl))
    except BaseException as exc:  # noqa: BLE001 (everything goes back to the parent)
        conn.send(_failure(exc))
        return
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        if method == "stop":
            return
        try:
            if method == "run":  # grads is keyword-only
                answer = inner.run(args[0], grads=args[1])
            elif method == "supports_with":  # need is keyword-only
                answer = inner.supports(args[0], need=args[1])
            else:
                answer = getattr(inner, method)(*args)
            conn.send(("ok", answer))
        except BaseException as exc:  # noqa: BLE001
            conn.send(_failure(exc))


def _failure(exc: BaseException) -> tuple:
    oom = _out_of_memory(exc)
    if oom is not None:
        text = str(oom).splitlines()[0] if str(oom) else ""
        return ("oom", f"{type(oom).__name__}: {text[-160:]}")
    if isinstance(exc, KernelError):
        return ("kernel_error", str(exc))
    tb = "".join(traceback.format_exception(exc))
    try:
        return ("exception", pickle.dumps(exc), tb)
    except Exception:  # noqa: BLE001 (unpicklable exception)
        return ("exception", None, tb)


# ---- the parent side --------------------------------------------------------
class IsolatedAdapter(Adapter):
    """An adapter whose kernel runs in a worker process (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], name: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_bytes: int = DEFAULT_MEMORY_BYTES, start_timeout_s: float = START_TIMEOUT_S):
        """`spec` is what the worker passes to `adapters.load`; `name` picks one of the adapters it returns
        (default: spec["impl"], else the first)."""
        super().__init__(spec.get("device", "cpu"))
        self.spec = dict(spec)
        if name is not None:
            self.spec["pick"] = name
        self.timeout_s, self.memory_bytes, self.start_timeout_s = timeout_s, memory_bytes, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.startup_s: float | None = None   # wall time of the last worker start, spawn included
        self.restarts = -1
        self._start()

    # -- the worker's life ---------------------------------------------------
    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        t0 = time.perf_counter()
        proc = self._ctx.Process(target=_worker, args=(child, self.spec, self.memory_bytes),
                                 name=f"attnconf-isolated-{self.spec.get('backend')}", daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.restarts += 1
        try:
            decl = self._receive(self.start_timeout_s, "starting the worker")
        except KernelError as exc:
            raise WorkerError(f"isolated worker for {self.spec} failed to start: {exc}") from None
        self.startup_s = time.perf_counter() - t0
        self.worker_startup_s = decl.pop("startup_s")
        self.memory_cap = decl.pop("memory_cap")
        self._describe = decl.pop("describe")
        self._forward_extra = decl.pop("extra_support")
        self._own_supports = decl.pop("own_supports")
        self._scope = decl.pop("scope")
        for name, value in decl.items():
            if value is not None:
                setattr(self, name, value)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(5)

    def close(self) -> None:
        """Stop the worker (it is also a daemon, so it never outlives this process)."""
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            try:
                self._conn.send(("stop", ()))
                self._proc.join(2)
            except OSError:
                pass
        self._kill()

    def __del__(self) -> None:
        try:
            self._kill()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # -- one request ------------------------------------------------------------
    def _receive(self, timeout: float, what: str) -> Any:
        ready = wait([self._conn, self._proc.sentinel], timeout)
        if self._conn in ready:
            try:
                reply = self._conn.recv()
            except (EOFError, OSError):
                reply = None
            if reply is not None:
                return self._unpack(reply, what)
        if not ready:
            self._kill()
            raise KernelCrashed(f"timeout: no answer after {timeout:g} s {what}; worker killed", "timeout")
        self._proc.join(5)
        code = self._proc.exitcode
        self._kill()
        raise KernelCrashed(f"worker died ({_describe_exit(code)}) {what}", "crashed")

    def _unpack(self, reply: tuple, what: str) -> Any:
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "kernel_error":
            raise KernelError(reply[1])
        if kind == "oom":
            self._kill()  # an allocator that failed once may have left the worker unusable
            limit = self.memory_bytes / (1 << 30)
            raise KernelCrashed(f"out of memory (limit {limit:g} GiB) {what}: {reply[1]}", "crashed")
        exc = pickle.loads(reply[1]) if reply[1] is not None else None
        if isinstance(exc, BaseException):
            exc.add_note(f"raised in the isolated worker; its traceback:\n{reply[2]}")
            raise exc
        raise WorkerError(f"the isolated worker raised {what}:\n{reply[2]}")

    def _call(self, method: str, args: tuple, what: str) -> Any:
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self._start()
        try:
            self._conn.send((method, args))
        except (OSError, ValueError):   # broken pipe: it died between calls
            self._kill()
            self._start()
            self._conn.send((method, args))
        return self._receive(self.timeout_s, what)

    # -- the Adapter interface ------------------------------------------------------
    def supports(self, case: Case, *, need: frozenset[str] = frozenset()) -> Literal[True] | str:
        if not self._own_supports:
            return super().supports(case, need=need)
        return self._call("supports_with", (_portable(case), frozenset(need)), f"checking support for {case.summary()}")

    def scope(self) -> dict[str, Any]:
        return self._scope

    def extra_support(self, case: Case) -> Literal[True] | str:
        if not self._forward_extra:
            return True
        return self._call("extra_support", (_portable(case),), f"checking support for {case.summary()}")

    def run(self, case: Case, *, grads: bool = False) -> Result:
        return self._call("run", (_portable(case), grads), f"on {case.summary()}")

    def run_raw(self, q, k, v, dtype):
        return self._call("run_raw", (q, k, v, dtype), f"on raw shapes {q.shape}, {k.shape}, {v.shape}")

    def run_layer(self, lc):
        return self._call("run_layer", (lc,), "on a layer case")

    def supports_layer(self, lc):
        return self._call("supports_layer", (lc,), "checking layer support")

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "isolated": True, "timeout_s": self.timeout_s,
                "memory_limit_gib": self.memory_bytes / (1 << 30)}

    def __repr__(self) -> str:
        return f"<IsolatedAdapter {self.name} on {self.device}>"


def _portable(case: Case) -> Case:
    """The case without its cache (the oracle's arrays need not cross the pipe)."""
    return dataclasses.replace(case, _cache={})


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"

