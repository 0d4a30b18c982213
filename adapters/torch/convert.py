"""NumPy <-> torch conversion and precision flags for the torch backend.

Case inputs are float64 values already rounded to the dtype under test, so the
conversion to the torch dtype is exact (bfloat16 goes through float32, which
holds every bfloat16 value). Outputs come back as float64 NumPy copies.
"""
from __future__ import annotations

import platform
from typing import Any

import numpy as np
import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def to_tensor(x: np.ndarray, dtype: str, device: str = "cpu") -> torch.Tensor:
    """An exact torch copy of `x` as `dtype` ("bool" for masks) on `device`."""
    # np.array(copy=True): never the case's own memory, which a kernel writing into its inputs would corrupt
    if dtype == "bool":
        return torch.from_numpy(np.array(x, dtype=bool, order="C", copy=True)).to(device)
    if dtype == "bfloat16":
        return torch.from_numpy(np.array(x, dtype=np.float32, order="C", copy=True)).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.array(x, dtype=np.float64, order="C", copy=True)).to(device=device, dtype=TORCH_DTYPES[dtype])


def to_numpy(t: Any) -> np.ndarray:
    """A float64 NumPy copy of a tensor (raises TypeError for anything else)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"not a tensor: {type(t).__name__}")
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    if t.dtype == torch.bool:
        return t.numpy().copy()
    return t.numpy().astype(np.float64)


def dtype_name(t: Any) -> str:
    return DTYPE_NAMES.get(t.dtype, str(t.dtype).removeprefix("torch."))


def set_precision(options: dict[str, Any]) -> None:
    """Full-precision float32 matmuls unless options['allow_tf32'] (then TF32 allowed)."""
    tf32 = bool(options.get("allow_tf32"))
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def limit_threads() -> int:
    """One intra-op thread for the small problems the suite runs (ATTNCONF_TORCH_THREADS overrides).

    On a shared 2-core machine OpenMP's spinning workers made a (6, 65, 128) float32 matmul
    take 23 ms with torch's default 2 threads against 0.85 ms with 1 (measured under load, torch
    2.13 CPU), and the kernel under test is called thousands of times per run."""
    import os

    n = int(os.environ.get("ATTNCONF_TORCH_THREADS", "1") or 1)
    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def precision_flags() -> dict[str, Any]:
    return {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_fp16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "cuda.matmul.allow_bf16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}


def device_info(device: str) -> dict[str, Any]:
    """Framework, version, device name and compute capability, for records."""
    info: dict[str, Any] = {"framework": "torch", "version": torch.__version__, "device": device}
    if device == "cuda" and torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name()
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["device_name"] = platform.processor() or platform.machine()
        info["compute_capability"] = None
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["flags"] = precision_flags()
    return info
