"""Adapters: one small interface (`adapters.base.Adapter`) and one module per backend.

`load()` turns the command-line choice (backend, device, implementation,
third-party kernel) into adapter objects, and every mistake in that choice
into a `UsageError` with a one-line message.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .base import CAPABILITIES, Adapter, KernelError, Result
from .callable import CallableAdapter, check_sdpa_signature

# backend name -> (adapter module, framework import name)
BACKENDS: dict[str, tuple[str, str]] = {
    "numpy": ("attnconf.adapters.numpy", "numpy"),
    "torch": ("attnconf.adapters.torch", "torch"),
    "jax": ("attnconf.adapters.jax", "jax"),
    "tensorflow": ("attnconf.adapters.tensorflow", "tensorflow"),
    "transformers": ("attnconf.adapters.transformers", "transformers"),
}
INSTALL_HINTS = {"numpy": "pip install numpy ml_dtypes", "torch": "pip install torch==2.13.0",
                 "jax": "pip install 'jax[cpu]' flax", "tensorflow": "pip install tensorflow-cpu",
                 "transformers": "pip install transformers (next to torch==2.13.0)"}


class UsageError(Exception):
    """A mistake in how the suite was invoked; the message is one line."""


def framework_installed(backend: str) -> bool:
    return importlib.util.find_spec(BACKENDS[backend][1]) is not None


def available_backends() -> list[str]:
    """The backends whose framework is installed here."""
    return [b for b in BACKENDS if framework_installed(b)]


def backend_module(backend: str):
    if backend not in BACKENDS:
        installed = ", ".join(available_backends())
        missing = ", ".join(b for b in BACKENDS if not framework_installed(b)) or "none"
        raise UsageError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)} "
                         f"(installed: {installed}; not installed: {missing})")
    if not framework_installed(backend):
        raise UsageError(f"backend {backend!r} needs {BACKENDS[backend][1]}, which is not installed; "
                         f"install it with: {INSTALL_HINTS[backend]}")
    return importlib.import_module(BACKENDS[backend][0])


def resolve_kernel(spec: str, check=check_sdpa_signature):
    """Import `MODULE:ATTR` and return the callable, or raise UsageError (`check` judges the signature)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--kernel must look like MODULE:ATTR; got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"--kernel {spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--kernel {spec}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    reason = check(obj)
    if reason:
        raise UsageError(f"--kernel {spec}: {reason}")
    return obj


def load(backend: str, *, device: str = "cpu", kernel: str | None = None,
         impl: str | None = None, options: dict[str, Any] | None = None,
         convention: str | None = None, capabilities: str | None = None) -> list[Adapter]:
    """The adapters to test for this invocation (raises UsageError on any mistake).

    `convention` names how a --kernel is called; `capabilities` is a TOML file declaring its scope.
    """
    module = backend_module(backend)
    options = options or {}
    if (convention or capabilities) and kernel is None:
        raise UsageError("--convention and --capabilities describe a --kernel; give --kernel=MODULE:ATTR too")
    if convention not in (None, "sdpa", "jax"):
        raise UsageError(f"unknown --convention {convention!r}")
    if device not in module.DEVICES:
        raise UsageError(f"unknown device {device!r} for backend {backend!r}; choose from {', '.join(module.DEVICES)}")
    if kernel is not None:
        fn = resolve_kernel(kernel, getattr(module, "check_kernel_signature", check_sdpa_signature))
        return [module.kernel_adapter(fn, device, f"{backend}:kernel:{kernel}")]
    adapters = module.implementations(device, options)
    if impl is not None:
        wanted = {w.strip() for w in impl.split(",")}
        names = [a.name for a in adapters]
        unknown = wanted - set(names)
        if unknown:
            raise UsageError(f"unknown --impl {', '.join(sorted(unknown))} for {backend} on {device}; "
                             f"available: {', '.join(names) or 'none'}")
        adapters = [a for a in adapters if a.name in wanted]
    if not adapters:
        raise UsageError(f"backend {backend!r} has no implementation that runs on {device!r}")
    return adapters


__all__ = ["Adapter", "BACKENDS", "CAPABILITIES", "CallableAdapter", "KernelError", "Result", "UsageError",
           "available_backends", "load", "resolve_kernel"]
