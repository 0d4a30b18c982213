"""The one declaration of attnconf's backends, and the ones other packages register.

Everything that names backends derives from `BUILTIN` here: `adapters.load`, the plugin's
`--backend` help, `attnconf backends` (and through `attnconf backends --names` the Makefile and
the CI workflow's matrix), `reports.runall`, the bench scripts, and pyproject's extras (checked
by tests/test_packaging.py).

Other packages add backends through the entry-point group `attnconf.backends`:

    [project.entry-points."attnconf.backends"]
    mykernels = "mykernels.attnconf_backend"            # the adapter module itself, or
    mykernels = "mykernels.attnconf_backend:BACKEND"    # a `Backend` declaration (imports nothing heavy)

The adapter module has the protocol of the built-in ones: `implementations(device, options)` and
`kernel_adapter(fn, device, name)` (optionally `check_kernel_signature(fn)`). A plain-module entry
point declares its devices with a module-level `DEVICES` tuple (default: cpu only).

A backend's other powers live in its pack (attnconf.adapters.pack): the package named by the
declaration's `pack`, else the adapter module itself when it is a package. The engine finds every
pack's regions, alternatives and witnesses modules and its divergences.toml through `pack_modules`
and `divergences_file` below, for built-in packs and entry points alike.

Nothing here imports a framework: "installed" means every import name is found by
`importlib.util.find_spec`, and versions come from the installed distributions' metadata.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Iterator, Mapping

from attnconf.adapters import pack as _pack

ENTRY_POINT_GROUP = "attnconf.backends"


@dataclass(frozen=True)
class Backend:
    """One backend: where its adapter lives and what it needs."""

    name: str
    module: str                               # the adapter module
    imports: tuple[str, ...]                  # framework import names that must be importable
    requirements: tuple[str, ...] = ()        # pip requirements of the extra (empty: core dependencies)
    devices: tuple[str, ...] | None = ("cpu",)  # None: the module's DEVICES decides (entry points)
    extra: str | None = None                  # attnconf's optional-dependency name
    origin: str = "attnconf"                  # "attnconf", or the distribution that registered it
    note: str = ""                            # why it is not usable, for entry points that failed
    # implementations too slow for a default run, with the measured reason: a run tests them only when
    # --impl names them; `make report` runs each in a process of its own
    opt_in: tuple[tuple[str, str], ...] = ()
    pack: str | None = None                   # the package of its regions, alternatives, witnesses, divergences

    @property
    def package(self) -> str | None:
        """The backend's pack: `pack`, else the adapter module when it is a package (None: it has none)."""
        if self.note:
            return None
        if self.pack:
            return self.pack
        return self.module if _pack.folder(self.module) is not None else None

    @property
    def install_hint(self) -> str:
        if self.origin != "attnconf":
            return f"pip install {self.origin}"
        if self.extra:
            return f"pip install 'attnconf[{self.extra}]'  (in a checkout: make setup)"
        return "pip install attnconf"

    def remedy(self) -> str:
        """What to do about a backend that is not usable (one phrase)."""
        if self.note:
            return f"fix or uninstall {self.origin}"
        if not self.adapter_present():
            if self.origin != "attnconf":
                return f"reinstall {self.origin}"
            return f"this attnconf ships no {self.module}; use an attnconf that has it"
        return f"install it with: {self.install_hint}"

    def missing_imports(self) -> list[str]:
        """The import names (framework or adapter module) that cannot be found here."""
        return [m for m in self.imports if not _findable(m)]

    def adapter_present(self) -> bool:
        """Whether the adapter module exists (it is not imported)."""
        return _findable(self.module)

    def installed(self) -> bool:
        """The framework and the adapter module are both there (nothing is imported)."""
        return not self.note and self.adapter_present() and not self.missing_imports()

    def status(self) -> str:
        if self.note:
            return self.note
        if not self.adapter_present():
            return f"adapter missing: no module {self.module}"
        missing = self.missing_imports()
        if missing:
            return f"not installed: needs {', '.join(missing)}"
        return "installed"

    def versions(self) -> dict[str, str]:
        """Installed versions of the distributions that provide the import names (from their metadata)."""
        out: dict[str, str] = {}
        for name in self.imports:
            for dist in _packages_distributions().get(name, []):
                try:
                    out[dist] = importlib.metadata.version(dist)
                except importlib.metadata.PackageNotFoundError:  # pragma: no cover (metadata just listed it)
                    continue
        return out


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing or broken
        return False


@cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def requirement_name(req: str) -> str:
    """'jax[cpu]' -> 'jax', 'torch==2.13.0' -> 'torch' (enough for the simple specifiers used here)."""
    for sep in ("[", "=", "<", ">", "!", "~", ";", " "):
        req = req.split(sep, 1)[0]
    return req.strip()


_TORCH = "torch==2.13.0"   # the CPU wheel this machine carries; any other specifier pulls a CUDA build
_JAX = "jax[cpu]"

# The built-in backends, in the order reports list them.
BUILTIN: tuple[Backend, ...] = (
    Backend("numpy", "attnconf.adapters.numpy", ("numpy", "ml_dtypes"), (), ("cpu",)),
    Backend("torch", "attnconf.adapters.torch", ("torch",), (_TORCH,), ("cpu", "cuda"), "torch",
            opt_in=(("torch:flex", "flex_attention on CPU compiles every new shape (0.2-1.2 s each): 156 s of a 210 s "
                                   "ci run of the torch backend, measured on a quiet 2-core CPU"),)),
    Backend("jax", "attnconf.adapters.jax", ("jax",), (_JAX, "flax"), ("cpu", "gpu"), "jax"),
    Backend("tensorflow", "attnconf.adapters.tensorflow", ("tensorflow",), ("tensorflow-cpu",), ("cpu", "gpu"),
            "tensorflow"),
    Backend("onnx", "attnconf.adapters.onnx", ("onnx", "onnxruntime"), ("onnx", "onnxruntime"), ("cpu",), "onnx"),
    Backend("tinygrad", "attnconf.adapters.tinygrad", ("tinygrad",), ("tinygrad",), ("cpu",), "tinygrad"),
    Backend("transformers", "attnconf.adapters.transformers", ("transformers", "torch"), ("transformers", _TORCH),
            ("cpu", "cuda"), "transformers",
            opt_in=(("transformers:flex", "torch.compile'd flex_attention compiles every new graph to C++ (5-60 s "
                                          "each here): 3 min 54 s cold for its ci run"),)),
    Backend("flax", "attnconf.adapters.flax", ("flax", "jax"), ("flax", _JAX), ("cpu", "gpu"), "flax",
            opt_in=(("flax:linen-dpa-fp32-softmax", "flax's non-default force_fp32_for_softmax=True compiles every "
                                                    "new shape again: 147 s of the 262 s a ci run of the flax backend "
                                                    "spent in tests (139 s wall with -n 2), measured on a quiet 2-core "
                                                    "CPU; alone it runs in about 80 s"),)),
    Backend("equinox", "attnconf.adapters.equinox", ("equinox", "jax"), ("equinox", _JAX), ("cpu", "gpu"), "equinox"),
)


def extras() -> dict[str, list[str]]:
    """The optional dependencies pyproject must declare: extra name -> requirements."""
    return {b.extra: list(b.requirements) for b in BUILTIN if b.extra}


def _from_entry_point(ep: importlib.metadata.EntryPoint) -> Backend:
    origin = ep.dist.name if ep.dist is not None else ep.value.split(":")[0].split(".")[0]
    module, _, attr = ep.value.partition(":")
    module, attr = module.strip(), attr.strip()
    if not attr:
        return Backend(ep.name, module, (), (), None, None, origin)
    try:
        decl = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # a broken third-party package must not break attnconf
        return Backend(ep.name, module, (), (), None, None, origin,
                       note=f"entry point {ep.value} failed to load: {type(exc).__name__}: {exc}".splitlines()[0])
    if not isinstance(decl, Backend):
        return Backend(ep.name, module, (), (), None, None, origin,
                       note=f"entry point {ep.value} is a {type(decl).__name__}, not an attnconf Backend")
    return Backend(ep.name, decl.module, tuple(decl.imports), tuple(decl.requirements), decl.devices, None, origin,
                   pack=decl.pack)


@dataclass
class Registry(Mapping[str, Backend]):
    """Backend name -> declaration: the built-ins, then entry points (discovered on first use).

    An entry point that reuses a built-in name is ignored (the built-in wins) and listed in
    `conflicts`, so installing a package can never silently replace a built-in backend.
    """

    _entries: dict[str, Backend] | None = None
    conflicts: list[str] = field(default_factory=list)

    def _load(self) -> dict[str, Backend]:
        if self._entries is None:
            entries = {b.name: b for b in BUILTIN}
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if ep.name in entries:
                    self.conflicts.append(f"entry point {ep.name} = {ep.value} ignored: {ep.name!r} is already a backend")
                    continue
                entries[ep.name] = _from_entry_point(ep)
            self._entries = entries
        return self._entries

    def __getitem__(self, name: str) -> Backend:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def reset(self) -> None:
        """Forget the discovered entry points (tests that install one call it)."""
        self._entries = None
        self.conflicts.clear()


REGISTRY = Registry()


def pack_modules(power: str) -> list[str]:
    """The import names of every registered pack's `power` module (regions, alternatives or witnesses),
    built-in packs first, each pack once."""
    packages = dict.fromkeys(b.package for b in REGISTRY.values())
    return [m for p in packages if p for m in _pack.power_modules(p, power)]


def divergences_file(backend: str) -> Path | None:
    """The divergences.toml of a registered backend's pack (None: unknown backend, no pack, no file)."""
    decl = REGISTRY.get(backend)
    package = decl.package if decl is not None else None
    return _pack.divergences_file(package) if package else None
