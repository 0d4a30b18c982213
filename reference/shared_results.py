"""Results of pure functions of a case's content (the emulated baselines), shared across Case objects and,
where ATTNCONF_BASELINE_CACHE names a folder, across processes.

The baselines are most of a run's time (reference/emulate.py: 60 naive forward variants, 20 backward ones),
and the same problems come back: the pinned cases are the same in every run, and under the ci profile two
kernels of one declared scope draw the same cases (conformance/engine/drawing.py draw_seed). In one process
the results are kept in memory (least recently used dropped past a limit); with a folder they are also
written there, one file per result, so the processes of `make test` (xdist workers, the catalogue's and the
suite's runs) and a later run on the same machine read them instead of emulating again.

A result on disk is keyed by the case's content and a salt: the source of this package (the emulation and
the oracle), NumPy's version and BLAS, and the CPU's flags (the "blas" accumulation order is NumPy's matmul,
whose kernels differ by instruction set). Anything else that could change a baseline changes the key, so a
stale file is never read; a file that cannot be read is recomputed. Writing is atomic (a temporary file,
then a rename), so concurrent workers never see half a file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

ENV = "ATTNCONF_BASELINE_CACHE"
DISK_LIMIT_BYTES = 8 << 20      # larger results (the longest cases) stay in memory only


def content_key(case: Any, *extra: Any) -> bytes:
    """A digest of everything a Case holds (its arrays' dtype, shape and bytes; every other field's
    repr), plus `extra`: two cases with the same key are the same problem."""
    h = hashlib.blake2b(digest_size=20)

    def feed(value: Any) -> None:
        if isinstance(value, np.ndarray):
            h.update(f"nd{value.dtype.str}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            h.update(b"{")
            for k in sorted(value, key=repr):
                feed(k)
                feed(value[k])
            h.update(b"}")
        elif isinstance(value, (list, tuple)):
            h.update(f"{type(value).__name__}{len(value)}(".encode())
            for item in value:
                feed(item)
            h.update(b")")
        else:
            h.update(f"{type(value).__name__}:{value!r};".encode())

    for f in dataclasses.fields(case):
        if f.name != "_cache":
            h.update(f.name.encode())
            feed(getattr(case, f.name))
    feed(extra)
    return h.digest()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def salt() -> bytes:
    """What a baseline depends on besides the case: this package's source, NumPy and its BLAS, the CPU."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(np.__version__.encode())
    try:
        h.update(repr(np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas")).encode())
    except Exception:          # older NumPy: the version says enough
        pass
    h.update(f"{platform.machine()}|{_cpu_flags()}".encode())
    return h.digest()


class SharedResults:
    """Results (dicts of arrays, read-only) of one pure function of a case's content, by `content_key`."""

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.items: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()
        self.nbytes = 0
        self._salt: bytes | None = None

    def _path(self, key: bytes) -> Path | None:
        folder = os.environ.get(ENV)
        if not folder:
            return None
        if self._salt is None:
            self._salt = salt()
        name = hashlib.blake2b(self._salt + key, digest_size=20).hexdigest()
        return Path(folder) / self.name / name[:2] / f"{name}.npz"

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
            return value
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as f:
                value = {n: f[n] for n in f.files}
        except Exception:           # a damaged file (writes are atomic): drop it, emulate again, write it anew
            path.unlink(missing_ok=True)
            return None
        for arr in value.values():
            arr.flags.writeable = False
        self._remember(key, value)
        return value

    def put(self, key: bytes, value: dict[str, np.ndarray]) -> None:
        if key in self.items:
            return
        self._remember(key, value)
        path = self._path(key)
        if path is None or sum(a.nbytes for a in value.values()) > DISK_LIMIT_BYTES or path.exists():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                np.savez(f, **value)
            os.replace(tmp, path)
        except OSError:            # a full or read-only disk: the run goes on from memory
            pass

    def _remember(self, key: bytes, value: dict[str, np.ndarray]) -> None:
        self.items[key] = value
        self.nbytes += sum(a.nbytes for a in value.values())
        while self.nbytes > self.limit_bytes and self.items:
            _, old = self.items.popitem(last=False)
            self.nbytes -= sum(a.nbytes for a in old.values())
