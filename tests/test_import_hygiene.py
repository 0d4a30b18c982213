"""Import hygiene: no import cycles among attnconf's modules, and importing a module changes no
process-wide setting (JAX x64, torch's dynamo and precision flags, TF32, environment variables):
adapters change what they need when they are created.

The cycle check reads the static import graph (every `import` statement, function-level ones
included: a lazy import that closes a cycle is still a cycle). The settings check imports each
adapter module in a fresh interpreter, snapshots the settings before and after, then loads the
backend's adapters and shows that the snapshot does see the changes they make (so the check can fail).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnconf.adapters.registry import BUILTIN

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("spec", "reference", "adapters", "conformance", "reports")


def module_files() -> dict[str, Path]:
    """attnconf module name -> source file, for the package and the folders mapped into it."""
    out = {"attnconf": ROOT / "attnconf" / "__init__.py"}
    for p in (ROOT / "attnconf").glob("*.py"):
        if p.name != "__init__.py":
            out[f"attnconf.{p.stem}"] = p
    for sub in SUBPACKAGES:
        for p in (ROOT / sub).rglob("*.py"):
            rel = p.relative_to(ROOT / sub).with_suffix("").parts
            name = ".".join(("attnconf", sub, *rel))
            out[name.removesuffix(".__init__")] = p
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # `from pkg import sub` imports the submodule when there is one
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in files else stem for a in node.names]
            for t in targets:
                while t and t not in files and "." in t:   # `import attnconf.adapters.base.X` -> the module
                    t = t.rpartition(".")[0]
                if t in files and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    files = module_files()
    assert "attnconf.adapters.jax" in files and "attnconf.reference.case" in files
    found = cycles(import_graph(files))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_cycle_finder_finds_cycles() -> None:
    """Guard against a finder that finds nothing: a lazy import back from base.py to numpy's adapter is a cycle."""
    files = module_files()
    graph = import_graph(files)
    assert "attnconf.adapters.base" in graph["attnconf.adapters.numpy.adapter"]
    graph["attnconf.adapters.base"].add("attnconf.adapters.numpy.adapter")
    assert any({"attnconf.adapters.base", "attnconf.adapters.numpy.adapter"} <= set(c) for c in cycles(graph))
    # relative and `from pkg import sub` forms resolve to modules
    assert "attnconf.adapters.base" in graph["attnconf.adapters.callable"]
    assert "attnconf.adapters.jax.common" in graph["attnconf.adapters.jax.layer"]
    assert "attnconf.adapters" in graph["attnconf.adapters.isolated"]


# ---- settings at import ------------------------------------------------------

# What each framework's process-wide settings are, read without changing them.
SNAPSHOT = textwrap.dedent('''
    import json, os, sys, warnings
    import numpy as np

    def snapshot(framework):
        s = {"env": dict(os.environ), "numpy_err": np.geterr(), "sys_path": list(sys.path),
             "warning_filters": len(warnings.filters)}
        if framework == "torch":
            import torch, torch._dynamo
            s.update(dynamo_cache_size_limit=torch._dynamo.config.cache_size_limit,
                     float32_matmul_precision=torch.get_float32_matmul_precision(),
                     cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                     cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                     deterministic=torch.are_deterministic_algorithms_enabled(),
                     default_dtype=str(torch.get_default_dtype()), threads=torch.get_num_threads())
        elif framework == "jax":
            import jax
            s.update(jax_enable_x64=bool(jax.config.jax_enable_x64),
                     jax_default_matmul_precision=str(jax.config.jax_default_matmul_precision))
        elif framework == "tensorflow":
            if "tensorflow" in sys.modules:
                import tensorflow as tf
                s.update(tf32=bool(tf.config.experimental.tensor_float_32_execution_enabled()))
        return s

    def diff(a, b):
        keys = sorted(set(a) | set(b))
        out = [k for k in keys if k not in ("env",) and a.get(k) != b.get(k)]
        env = sorted(k for k in set(a["env"]) | set(b["env"]) if a["env"].get(k) != b["env"].get(k))
        return out + ["env:" + k for k in env]
''')

# The declared exceptions: settings a module's import may change, and why (see the module's docstring).
IMPORT_EFFECTS = {
    # `import tensorflow` imports Keras, which reads KERAS_BACKEND once; TF reads its log level at load
    "tensorflow": {"env:KERAS_BACKEND", "env:TF_CPP_MIN_LOG_LEVEL"},
}
# Settings that loading the backend's adapters does change: proof that the snapshot sees them.
LOAD_EFFECTS = {
    "jax": {"jax_enable_x64"},
    "torch": {"cudnn_allow_tf32"},   # set_precision turns TF32 off (torch's default for cuDNN is on)
}


def third_party_imports(modules: list[str]) -> list[str]:
    """The non-attnconf modules the given attnconf modules import at module level, in order."""
    files = module_files()
    out: list[str] = []
    for m in modules:
        for node in ast.parse(files[m].read_text(encoding="utf-8")).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            out += [n for n in names if n.split(".")[0] not in ("attnconf", "__future__") and n not in out]
    return out


def probe(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")}
    proc = subprocess.run([sys.executable, "-c", SNAPSHOT + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**env, "OPENBLAS_NUM_THREADS": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[0][len("RESULT"):])


def adapter_modules(backend: str) -> list[str]:
    """The backend's pack and every module in it (attnconf/adapters/<backend>/*.py)."""
    pack = f"attnconf.adapters.{backend}"
    return [pack, *(f"{pack}.{p.stem}" for p in sorted((ROOT / "adapters" / backend).glob("*.py")) if p.stem != "__init__")]


@pytest.mark.parametrize("backend", [b.name for b in BUILTIN if b.installed()])
def test_importing_an_adapter_changes_no_setting(backend: str) -> None:
    """The state after importing the adapter modules equals the state after importing just the
    third-party modules they import (the frameworks' own import effects cancel out); loading the
    adapters then changes what they need, and the snapshot sees it."""
    modules = adapter_modules(backend)
    framework = next(b for b in BUILTIN if b.name == backend).imports[0]
    frameworks = third_party_imports(modules)
    if not any(m.split(".")[0] == framework for m in frameworks):   # the adapter imports its framework lazily
        frameworks = [*frameworks, framework]
    body = textwrap.dedent(f"""
        import importlib
        from attnconf import adapters
        for m in {{mods!r}}:
            importlib.import_module(m)
        state = snapshot({framework!r})
    """)
    baseline = probe(body.format(mods=frameworks) + "print('RESULT' + json.dumps(state))\n")
    result = probe(body.format(mods=modules) + textwrap.dedent(f"""
        adapters.load({backend!r})
        print("RESULT" + json.dumps({{"state": state, "load": diff(state, snapshot({framework!r}))}}))
    """))
    changed = probe_diff(baseline, result["state"])
    allowed = IMPORT_EFFECTS.get(backend, set())
    assert set(changed) <= allowed, f"importing {backend}'s adapter modules changed {changed}"
    assert LOAD_EFFECTS.get(backend, set()) <= set(result["load"]), result["load"]


def probe_diff(a: dict, b: dict) -> list[str]:
    out = [k for k in sorted(set(a) | set(b)) if k != "env" and a.get(k) != b.get(k)]
    env = sorted(k for k in set(a["env"]) | set(b["env"]) if a["env"].get(k) != b["env"].get(k))
    return out + ["env:" + k for k in env]


def test_importing_attnconf_changes_no_setting() -> None:
    """The package, the registry, the CLI and the reports: what an unrelated pytest run loads too."""
    changed = probe('''
        import numpy, hypothesis
        before = snapshot(None)
        import attnconf, attnconf.adapters, attnconf.adapters.registry, attnconf.cli, attnconf.reference
        import attnconf.spec, attnconf.reports
        print("RESULT" + json.dumps(diff(before, snapshot(None))))
    ''')
    assert changed == []


def test_backend_list_is_light() -> None:
    """`attnconf backends` (the CI matrix job runs it on a bare Python) and the registry import no NumPy."""
    proc = subprocess.run([sys.executable, "-c", "import sys, attnconf.adapters.registry, attnconf.cli; "
                           "print(sorted(m for m in ('numpy', 'hypothesis', 'torch', 'jax', 'tensorflow') if m in sys.modules))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
