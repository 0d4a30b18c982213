"""Run saved cases (.npz, as a conformance run saves its failing cases) through one implementation on
the GPU and keep what it returned, so that what a divergence entry should declare can be worked out
on a machine without a GPU, against the float64 reference.

    python3 tests/gpu/dump_outputs.py BACKEND DEVICE IMPL OUT.npz CASE.npz...

OUT.npz holds, per case file name, `<name>::out` (and `::lse`, `::dq`, ... where returned), and
`<name>::error` with the exception text where the call raised. Cases with a bias broadcast over
the query or key axis run last: on torch's cuDNN path they can fault and poison the CUDA context.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attnconf import adapters  # noqa: E402
from attnconf.reference import Case  # noqa: E402


def _risky(case: Case) -> bool:
    b = case.bias
    return b is not None and b.ndim == 4 and (b.shape[2] == 1 or b.shape[3] == 1)


def main(backend: str, device: str, impl_name: str, out_path: str, files: list[str]) -> None:
    impl = next(a for a in adapters.load(backend, device=device) if a.name == impl_name)
    cases = sorted(((Path(f).stem, Case.load(f)) for f in files), key=lambda nc: _risky(nc[1]))
    saved: dict[str, np.ndarray] = {}
    for name, case in cases:
        grads = case.grad_out is not None and "grads" in impl.capabilities
        for attempt in ((True, False) if grads else (False,)):
            try:
                res = impl.run(case, grads=attempt)
            except Exception as exc:  # noqa: BLE001 - what it raises is the measurement
                saved[f"{name}::error"] = np.array(f"grads={attempt}: {type(exc).__name__}: {str(exc)[:400]}")
                continue
            saved[f"{name}::out"] = np.asarray(res.out, dtype=np.float64)
            if res.lse is not None:
                saved[f"{name}::lse"] = np.asarray(res.lse, dtype=np.float64)
            for q, g in (res.grads or {}).items():
                saved[f"{name}::{q}"] = np.asarray(g, dtype=np.float64)
            saved.pop(f"{name}::error", None)
            break
        print(name, "error" if f"{name}::error" in saved else "ok", flush=True)
        np.savez_compressed(out_path, **saved)   # after every case: a fault later keeps what came before


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
