"""Where a conformance run's time goes: framework import, Hypothesis, the reference, the kernel.

Runs `pytest conformance --backend=X --hypothesis-profile=ci` in this process under cProfile
and sums each function's own time by where its code lives. Framework import time is
measured separately in a fresh interpreter.

    .venv/bin/python bench/profile_suite.py torch
"""
from __future__ import annotations

import cProfile
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = (("reference (float64 oracle + baselines)", ("/reference/",)),
          ("suite (conformance/, checks)", ("/conformance/",)),
          ("adapters (glue)", ("/adapters/",)),
          ("hypothesis (generation, shrinking)", ("/hypothesis/",)),
          ("pytest", ("/_pytest/", "/pluggy/")),
          ("numpy", ("/numpy/",)))


def main(backend: str) -> dict:
    t0 = time.perf_counter()
    from attnconf.adapters import BACKENDS

    subprocess.run([sys.executable, "-c", f"import {BACKENDS[backend].imports[0]}"], check=True)
    import_s = time.perf_counter() - t0 - _bare_python()
    import pytest

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(pytest.main, ["conformance", f"--backend={backend}", "--hypothesis-profile=ci", "-q",
                               "-p", "no:cacheprovider"])
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    totals = {name: 0.0 for name, _ in GROUPS}
    totals["kernel (framework code)"] = 0.0
    totals["other"] = 0.0
    for (filename, _, funcname), (_, _, tottime, _, _) in stats.items():
        if filename == "~":  # a C builtin: its owner is only named in the function name
            filename = "/" + ("torch" if "torch" in funcname else "jaxlib" if "jax" in funcname or "xla" in funcname
                              else "tensorflow" if "tensorflow" in funcname or "tf" in funcname
                              else "numpy" if "numpy" in funcname else "builtins") + "/"
        for name, parts in GROUPS:
            if any(p in filename for p in parts):
                totals[name] += tottime
                break
        else:
            key = "kernel (framework code)" if any(f"/{m}/" in filename for m in ("torch", "jax", "jaxlib", "tensorflow",
                                                                                      "keras", "flax")) else "other"
            totals[key] += tottime
    result = {"backend": backend, "wall_s": round(wall, 1), "framework_import_s": round(import_s, 1),
              "self_time_s": {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}}
    print(json.dumps(result, indent=1))
    return result


def _bare_python() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    out = ROOT / "bench" / "profile.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data[sys.argv[1]] = main(sys.argv[1])
    out.write_text(json.dumps(data, indent=1))
