"""Backends registered by other packages (entry-point group `attnconf.backends`), and the LayerAdapter protocol."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnconf import adapters
from attnconf.adapters.base import Adapter, Implementation, KernelError, LayerAdapter
from attnconf.reference.layer import random_layer_case

ROOT = Path(__file__).resolve().parent.parent


def with_entry_points(tmp: Path, lines: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` with a distribution on sys.path that declares `lines` in [attnconf.backends]."""
    site = tmp / "site"
    info = site / "extra_backends-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-backends\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[attnconf.backends]\n" + "\n".join(lines) + "\n")
    (site / "extra_backends.py").write_text(
        "from attnconf.adapters.registry import Backend\n"
        "DECL = Backend('ignored-name', 'attnconf.adapters.numpy', ('numpy',), (), ('cpu',))\n"
        "NOT_A_BACKEND = 3\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True, timeout=120, env=env)


def test_entry_point_backends(tmp_path: Path) -> None:
    proc = with_entry_points(tmp_path, [
        "mynp = attnconf.adapters.numpy",            # a plain adapter module
        "declared = extra_backends:DECL",            # a Backend declaration
        "torch = attnconf.adapters.numpy",           # a built-in name: ignored, reported
        "broken = extra_backends:NOT_A_BACKEND",     # not a declaration
        "gone = extra_backends_missing:DECL",        # fails to import
    ], """
import json
from attnconf import adapters
from attnconf.adapters.registry import REGISTRY
out = {n: [REGISTRY[n].origin, REGISTRY[n].status()] for n in REGISTRY}
out["_torch_module"] = REGISTRY["torch"].module
out["_conflicts"] = REGISTRY.conflicts
out["_loaded"] = [a.name for a in adapters.load("mynp")] + [a.name for a in adapters.load("declared")]
try:
    adapters.load("broken")
except adapters.UsageError as exc:
    out["_broken"] = str(exc)
print(json.dumps(out))
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["mynp"] == ["extra-backends", "installed"] and out["declared"][1] == "installed"
    assert out["_loaded"] == ["numpy:reference", "numpy:reference"]
    assert out["_torch_module"] == "attnconf.adapters.torch" and "torch = attnconf.adapters.numpy" in out["_conflicts"][0]
    assert "not an attnconf Backend" in out["broken"][1] and "not an attnconf Backend" in out["_broken"]
    assert "failed to load: ModuleNotFoundError" in out["gone"][1]


class _Layer(LayerAdapter):
    backend = "test"
    name = "test:layer"
    dtypes = ("float64",)
    capabilities = frozenset({"mask"})

    def run_layer(self, lc):
        raise KernelError("not run in this test")


def test_layer_adapter_protocol() -> None:
    rng = np.random.default_rng(0)
    layer = _Layer()
    assert layer.kind == "layer" and not hasattr(layer, "run") and isinstance(layer, Implementation)
    assert not isinstance(layer, Adapter)
    plain = random_layer_case(rng, 1, 3, 3, 4, 2)
    assert layer.supports_layer(plain) is True
    masked = random_layer_case(rng, 1, 3, 3, 4, 2, mask="random")
    assert layer.supports_layer(masked) is True
    assert layer.supports_layer(random_layer_case(rng, 1, 3, 5, 4, 2)) == "test:layer lacks cross"
    assert layer.supports_layer(random_layer_case(rng, 1, 3, 3, 4, 2, causal="top_left")) == \
        "test:layer lacks causal_top_left"
    assert layer.supports_layer(random_layer_case(rng, 1, 3, 3, 4, 2, dtype="float32")) == "test:layer does not run float32"
    assert masked.features() == {"mask"}


@pytest.mark.parametrize("backend", [b for b in ("torch", "jax", "tensorflow") if adapters.BACKENDS[b].installed()])
def test_builtin_layer_adapters_declare_the_protocol(backend: str) -> None:
    code = (f"from attnconf import adapters; from attnconf.adapters.base import LayerAdapter; "
            f"ls = [a for a in adapters.load({backend!r}) if a.kind == 'layer']; "
            f"print(len(ls), all(isinstance(a, LayerAdapter) and not hasattr(a, 'run') for a in ls))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, ok = proc.stdout.split()[-2:]
    assert int(count) >= 1 and ok == "True"


def test_builtin_packs_are_found_through_the_registry() -> None:
    """Each built-in backend is a pack (attnconf.adapters.<name>); the engine's discovery lists their
    regions, alternatives and witnesses modules and their divergences.toml from the declarations."""
    from attnconf.adapters.registry import BUILTIN, divergences_file, pack_modules

    assert all(b.package == b.module == f"attnconf.adapters.{b.name}" for b in BUILTIN)
    files = {b.name: divergences_file(b.name) for b in BUILTIN}
    assert all(p is None or p == ROOT / "adapters" / name / "divergences.toml" for name, p in files.items())
    assert {n for n, p in files.items() if p} == {b.name for b in BUILTIN} - {"numpy"}
    assert divergences_file("no-such-backend") is None
    for power in ("regions", "alternatives", "witnesses"):
        assert {f"attnconf.adapters.{b}.{power}" for b in ("onnx", "tinygrad", "transformers", "flax")} <= \
            set(pack_modules(power))
    assert "attnconf.adapters.torch.witnesses" in pack_modules("witnesses")
