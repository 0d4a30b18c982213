"""Adapters: one small interface (`adapters.base.Adapter`) and one pack per backend (`adapters/<backend>/`).

`load()` turns the command-line choice (backend, device, implementation,
third-party kernel) into adapter objects, and every mistake in that choice
into a `UsageError` with a one-line message. The backends themselves are
declared once, in `registry.py`.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Mapping

from .registry import REGISTRY, Backend

if TYPE_CHECKING:
    from .base import CAPABILITIES, Adapter, Implementation, KernelError, LayerAdapter, Result
    from .callable import CallableAdapter

# The interface names are imported on first use, so that `attnconf.adapters.registry` (the backend
# list: what `attnconf backends` and the plugin's option help need) costs no NumPy import.
_LAZY = {"CAPABILITIES": ".base", "Adapter": ".base", "Implementation": ".base", "KernelError": ".base",
         "LayerAdapter": ".base", "Result": ".base", "CallableAdapter": ".callable",
         "ConventionViolation": ".base", "NotSupported": ".base"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Backend name -> declaration (registry.py: the built-ins and the `attnconf.backends` entry points).
BACKENDS: Mapping[str, Backend] = REGISTRY
# the calling convention a --kernel takes when --convention is not given
NATIVE_CONVENTION = {"numpy": "sdpa", "torch": "sdpa", "jax": "jax", "tensorflow": "sdpa"}


class UsageError(Exception):
    """A mistake in how the suite was invoked; the message is one line."""


def framework_installed(backend: str) -> bool:
    """The backend's framework and its adapter module are present (nothing is imported)."""
    return BACKENDS[backend].installed()


def available_backends() -> list[str]:
    """The backends that can run here: adapter module present and framework installed."""
    return [b for b in BACKENDS if framework_installed(b)]


def backend_module(backend: str):
    """Import the adapter module of `backend`, or raise UsageError saying what is missing."""
    if backend not in BACKENDS:
        installed = ", ".join(available_backends()) or "none"
        missing = ", ".join(b for b in BACKENDS if not framework_installed(b)) or "none"
        raise UsageError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)} "
                         f"(installed: {installed}; not installed: {missing})")
    decl = BACKENDS[backend]
    if not decl.installed():
        raise UsageError(f"backend {backend!r}: {decl.status()}; {decl.remedy()}")
    try:
        module = importlib.import_module(decl.module)
        getattr(module, "implementations", None)    # a pack imports its adapter module (and framework) here
        return module
    except Exception as exc:  # the framework is there but does not import (broken install, ABI mismatch)
        first = (str(exc).splitlines() or [""])[0]
        raise UsageError(f"backend {backend!r}: importing {decl.module} failed: {type(exc).__name__}: {first}") from None


def backend_devices(backend: str, module=None) -> tuple[str, ...]:
    """The devices a backend runs on: its declaration, else (entry points) the module's DEVICES."""
    declared = BACKENDS[backend].devices
    if declared is not None:
        return declared
    return tuple(getattr(module or backend_module(backend), "DEVICES", ("cpu",)))


def resolve_kernel(spec: str, check=None):
    """Import `MODULE:ATTR` and return the callable, or raise UsageError (`check` judges the signature)."""
    if check is None:
        from .callable import check_sdpa_signature as check
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
    from .base import Adapter

    if isinstance(obj, Adapter) or (isinstance(obj, type) and issubclass(obj, Adapter)):
        return obj                      # a ready-made adapter: it declares and converts for itself
    reason = check(obj)
    if reason:
        raise UsageError(f"--kernel {spec}: {reason}")
    return obj


def load(backend: str, *, device: str = "cpu", kernel: str | None = None,
         impl: str | None = None, options: dict[str, Any] | None = None,
         convention: str | None = None, capabilities: str | None = None) -> list[Adapter]:
    """The adapters to test for this invocation (raises UsageError on any mistake).

    `convention` names how a --kernel is called (default: the backend's own, `sdpa` for torch and
    numpy, `jax` for JAX; torch also takes the conventions of `adapters.conventions`);
    `capabilities` is a TOML file declaring the kernel's scope, as its `attnconf_capabilities`
    attribute would (adapters/scope.py).
    """
    module = backend_module(backend)
    options = options or {}
    if (convention or capabilities) and kernel is None:
        raise UsageError("--convention and --capabilities describe a --kernel; give --kernel=MODULE:ATTR too")
    native = NATIVE_CONVENTION.get(backend, "sdpa")
    from . import conventions

    known = (native,) + (conventions.NAMES if backend == "torch" else ())
    if convention is not None and convention not in known:
        raise UsageError(f"unknown --convention {convention!r} for backend {backend!r}; choose from: {', '.join(known)}")
    devices = backend_devices(backend, module)
    if device not in devices:
        raise UsageError(f"unknown device {device!r} for backend {backend!r}; choose from {', '.join(devices)}")
    if kernel is not None:
        from . import scope
        from .base import Adapter

        ready = resolve_kernel(kernel, check=lambda obj: None)
        if isinstance(ready, Adapter) or (isinstance(ready, type) and issubclass(ready, Adapter)):
            return [_ready_adapter(ready, kernel, backend, device, convention)]
        if convention in (None, native):
            fn = resolve_kernel(kernel, getattr(module, "check_kernel_signature", None))
            adapter = module.kernel_adapter(fn, device, f"{backend}:kernel:{kernel}")
            adapter.convention = native
            expressible = None
        else:
            conv = conventions.get(convention)
            fn = resolve_kernel(kernel, conv.check_signature)
            from .conventions.common import ConventionAdapter

            adapter = ConventionAdapter(fn, conv, device, f"{backend}:{convention}:{kernel}")
            expressible = conv.features
        try:
            scope.declare(adapter, fn, capabilities, expressible=expressible)
        except scope.ScopeError as exc:
            raise UsageError(f"--kernel {kernel}: declared scope: {exc}") from None
        return [adapter]
    adapters = module.implementations(device, options)
    if impl is not None:
        wanted = {w.strip() for w in impl.split(",")}
        names = [a.name for a in adapters]
        unknown = wanted - set(names)
        if unknown:
            raise UsageError(f"unknown --impl {', '.join(sorted(unknown))} for {backend} on {device}; "
                             f"available: {', '.join(names) or 'none'}")
        adapters = [a for a in adapters if a.name in wanted]
    else:           # an implementation too slow for a default run is tested only when named (registry.py)
        slow = {name for name, _ in getattr(BACKENDS.get(backend), "opt_in", ())}
        adapters = [a for a in adapters if a.name not in slow]
    if not adapters:
        raise UsageError(f"backend {backend!r} has no implementation that runs on {device!r}")
    return adapters


def _ready_adapter(obj, spec: str, backend: str, device: str, convention: str | None) -> "Adapter":
    """A --kernel that is already an `Adapter` (class or instance): used as is, for any backend and any
    features it declares (a calling convention that cannot express a window, a softcap, ALiBi or sinks
    is not in the way), but untrusted like every third-party kernel and named after the --kernel."""
    if convention is not None:
        raise UsageError(f"--kernel {spec} is an Adapter, which defines its own calling convention; drop --convention")
    if isinstance(obj, type):
        try:
            obj = obj(device)
        except Exception as exc:
            raise UsageError(f"--kernel {spec}: cannot instantiate the Adapter: {type(exc).__name__}: {exc}") from None
    if device not in obj.devices:
        raise UsageError(f"--kernel {spec}: the Adapter runs on {', '.join(obj.devices)}, not {device!r}")
    obj.device = device
    obj.trusted = False
    obj.name = f"{backend}:kernel:{spec}"
    return obj


__all__ = ["Adapter", "BACKENDS", "Backend", "CAPABILITIES", "CallableAdapter", "ConventionViolation", "Implementation",
           "KernelError", "LayerAdapter", "NotSupported", "Result", "UsageError", "available_backends",
           "backend_devices", "load", "resolve_kernel"]
