"""The `numpy` backend: the float64 reference as an implementation, and NumPy kernels.

`numpy:reference` returns the oracle rounded once to the dtype under test: a
perfect kernel. It lets the whole suite run end to end with nothing but NumPy,
and it is what every property must pass. It implements every feature of the
spec (window, softcap, ALiBi, sinks included); its lse is the oracle's, so it
includes a sink (ATTN-SINK-2) and is the sink on rows that see no key, rounded
to float32 (the statistic's dtype in flash-style kernels) below float64. `--kernel` with `--backend=numpy`
wraps a NumPy function with the SDPA calling convention.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from attnconf import reference
from attnconf.reference import Case, numpy_dtype, round_to

from attnconf.adapters.base import CAPABILITIES, Adapter, Result
from attnconf.adapters.callable import CallableAdapter


class ReferenceAdapter(Adapter):
    backend = "numpy"
    name = "numpy:reference"
    capabilities = CAPABILITIES

    def run(self, case: Case, *, grads: bool = False) -> Result:
        f = reference.oracle(case)
        w, keep = f.weights, None
        if case.dropout_p:
            rng = np.random.default_rng(case.seed)
            keep = rng.random(w.shape) >= case.dropout_p
            w = np.where(keep, w / (1.0 - case.dropout_p), 0.0)
            out = np.einsum("bhij,bhjd->bhid", w, reference.expand_kv(case.v, case.shape["Hq"]))
        else:
            out = f.out
        t = case.dtype
        res = Result(out=round_to(out, t), out_dtype=t, lse=round_to(f.lse, "float32" if t != "float64" else t),
                     weights=round_to(w, t), kernel="reference float64, rounded once to the dtype")
        if grads:
            from attnconf.reference.backward import backward, backward_arrays  # noqa: PLC0415 (heavy only when asked)
            from attnconf.reference.attention import case_params  # noqa: PLC0415

            # under dropout, the gradients of the forward it returned: the same keep mask (ATTN-DROP-3)
            g = backward(case) if keep is None else backward_arrays(
                case.q, case.k, case.v, case.grad_out, fwd=f, dropout=(keep, case.dropout_p), **case_params(case))
            res.grads = {n: round_to(getattr(g, n), t) for n in ("dq", "dk", "dv")}
            if case.bias is not None:
                res.grads["dbias"] = round_to(g.dbias, t)
            if case.sinks is not None:   # ATTN-SINK-4: flash-attention 4 differentiates its learnable sink
                res.grads["dsinks"] = round_to(g.dsinks, t)
        return res

    def run_raw(self, q, k, v, dtype):
        return reference.attention(q, k, v)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "framework": "numpy", "version": np.__version__,
                "kernel": "reference.attention (float64), output rounded to the dtype"}


def implementations(device: str, options: dict[str, Any]) -> list[Adapter]:
    return [ReferenceAdapter(device)]


def kernel_adapter(fn: Callable[..., Any], device: str, name: str) -> Adapter:
    adapter = CallableAdapter(
        fn, backend="numpy", name=name, device=device,
        to_array=lambda x, dtype: np.array(x, dtype=bool, copy=True) if dtype == "bool" else np.asarray(x).astype(numpy_dtype(dtype)),
        to_numpy=lambda a: a if isinstance(a, np.ndarray) and a.dtype != object else _not_array(a),
        dtype_name=lambda a: a.dtype.name)
    adapter.seeds_dropout = False       # the SDPA convention on NumPy arrays hands the kernel no generator or seed
    return adapter


def _not_array(a: Any) -> np.ndarray:
    raise TypeError(f"not an array: {type(a).__name__}")
