"""The synthetic run files in tests/fixtures/runs/ are generated here, so they cannot drift.

`python tests/test_reports_fixtures.py` rewrites them; the test checks the committed files equal
what this module generates and that the good ones validate.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attnconf.reports import runfile  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
XSS = "<script>alert(1)</script>"

PANEL_BASE = {
    "P01": np.array([[[[0.25, -0.5], [1.0, 0.125]]]]),
    "P02": np.array([[[[2.0, 3.0], [4.0, 5.0]]]]),
    "P03": np.array([[[[math.nan, 1.0], [0.0, 0.5]]]]),
}


def b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype="<f8").tobytes()).decode("ascii")


def panel(offsets: dict[str, float], allowance: float, nan_moves: bool = False) -> list[dict[str, Any]]:
    out = []
    for case, base in PANEL_BASE.items():
        if case not in offsets:
            out.append({"case": case, "description": f"{case} not run", "dtype": "float16",
                        "status": "unsupported", "reason": "float16 not supported"})
            continue
        arr = base + offsets[case]
        if nan_moves and case == "P03":
            arr = arr.copy()
            arr[0, 0, 0, 0], arr[0, 0, 0, 1] = 0.0, math.nan
        out.append({"case": case, "description": f"float32 causal=bottom_right Lq=2 Lk=2 ({case})",
                    "dtype": "float32", "status": "ran", "shape": list(arr.shape),
                    "out_b64": b64(arr), "allowance": allowance})
    return out


def environment(backend: str, device: str, impls: list[str], kernel: str | None = None) -> dict[str, Any]:
    return {
        "suite_version": "0.1.0", "git_revision": "abc1234", "spec_hash": "0" * 64,
        "backend": backend, "device": device,
        "device_name": "NVIDIA H100 80GB HBM3" if device == "cuda" else "x86_64 CPU",
        "compute_capability": "9.0" if device == "cuda" else None,
        "frameworks": {backend: "1.0.0", "numpy": "2.4.6"}, "python": "3.11.7",
        "platform": "Linux-6.1-x86_64", "precision_flags": {"allow_tf32": False},
        "hypothesis": {"profile": "ci", "seed": None, "max_examples": 25, "derandomize": True},
        "kernel": kernel,
        "implementations": {i: {"backend": backend, "implementation": i, "device": device} for i in impls},
    }


def record(test: str, clauses: list[str], impl: str | None, status: str = "pass", **extra: Any) -> dict[str, Any]:
    rec = {"nodeid": f"conformance/test_x.py::{test}[{impl}]", "test": test, "clauses": clauses,
           "implementation": impl, "status": status, "divergences": [], "examples": 25,
           "examples_unsupported": 0, "examples_divergent": 0, "unsupported_reasons": [],
           "ratios": {}, "samples": [], "message": None, "case": None, "replay": None,
           "failure_file": None, "duration_s": 0.5}
    rec.update(extra)
    return rec


def ratios(**per_dtype: float) -> dict[str, Any]:
    return {dt: {"max": m, "mean": m / 2, "cases": 10} for dt, m in per_dtype.items()}


def samples(dtype: str, scale: float) -> list[dict[str, Any]]:
    return [{"dtype": dtype, "Lq": lk // 2 + 1, "Lk": lk, "Dk": dk,
             "ratio_max": scale * (0.2 + 0.1 * math.log2(lk) / 8 + dk / 512),
             "ratio_mean": scale * 0.1}
            for lk, dk in [(1, 8), (7, 16), (33, 64), (129, 64), (512, 128), (1024, 256)]]


def failure(message: str, case: str, impl: str) -> dict[str, Any]:
    return {"message": message, "case": case,
            "replay": f".venv/bin/python -m conformance.replay reports/failures/{impl.replace(':', '_')}-1.npz",
            "failure_file": f"reports/failures/{impl.replace(':', '_')}-1.npz"}


def numpy_cpu() -> dict[str, Any]:
    impl = "numpy:naive"
    return {
        "schema_version": 1, "run_id": "numpy-cpu-20261122T120000-aaaaaa", "created": "2026-11-22T12:00:00Z",
        "environment": environment("numpy", "cpu", [impl]),
        "records": [
            record("test_output_matches_reference", ["ATTN-OP-1", "ATTN-TOL-1"], impl,
                   ratios=ratios(float16=0.61, float32=0.42, float64=0.05),
                   samples=samples("float32", 1.0) + samples("float16", 1.4)),
            record("test_boolean_mask", ["ATTN-MASK-1"], impl, ratios=ratios(float32=0.3)),
            record("test_fully_masked_rows", ["ATTN-EMPTY-1"], impl),
            record("test_dropout", ["ATTN-DROP-1"], impl, status="unsupported",
                   unsupported_reasons=["numpy:naive lacks dropout"]),
        ],
        "observations": [
            {"clause": "ATTN-NAN-1", "implementation": impl, "key": "nan_in_attended_query",
             "value": "NaN propagates to the row", "case": "B=1 Hq=1 Lq=2 Lk=3 float32"},
            {"clause": "ATTN-OP-7", "implementation": impl, "key": "bitwise_deterministic", "value": True,
             "case": None},
        ],
        "panel": {impl: panel({"P01": 0.0, "P02": 0.0, "P03": 0.0}, 1e-6)},
        "clause_coverage": {"ATTN-OP-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-TOL-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-MASK-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-EMPTY-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-DROP-1": {"passed": 0, "run": 0, "total": 1}},
        "divergences": [],
        "verdict": {"verdict": "CONFORMANT", "divergences": [], "failed_clauses": []},
    }


def torch_cpu() -> dict[str, Any]:
    math_, eff = "torch:sdpa-math", "torch:sdpa-efficient"
    return {
        "schema_version": 1, "run_id": "torch-cpu-20261122T120500-bbbbbb", "created": "2026-11-22T12:05:00Z",
        "environment": environment("torch", "cpu", [math_, eff]),
        "records": [
            record("test_output_matches_reference", ["ATTN-OP-1", "ATTN-TOL-1"], math_,
                   ratios=ratios(float32=0.81, bfloat16=0.9), samples=samples("float32", 1.6)),
            record("test_output_matches_reference", ["ATTN-OP-1", "ATTN-TOL-1"], eff,
                   ratios=ratios(float32=0.7), samples=samples("float32", 1.2)),
            record("test_fully_masked_rows", ["ATTN-EMPTY-1"], math_, status="divergent",
                   divergences=["TORCH-EMPTY-NAN"], examples_divergent=25,
                   message="fully-masked row gives NaN (documented divergence TORCH-EMPTY-NAN)"),
            record("test_gqa_grouping", ["ATTN-GQA-1"], eff, status="fail", ratios=ratios(float32=12.5),
                   **failure("output differs from reference: ratio 12.5 > 1 at [0, 3, 7, :]",
                             "B=2 Hq=8 Hkv=2 Lq=9 Lk=17 Dk=64 float32 causal=None", eff)),
            record("test_gqa_grouping", ["ATTN-GQA-1"], math_, ratios=ratios(float32=0.2)),
            record("test_dropout", ["ATTN-DROP-1"], eff, status="crashed",
                   **failure("worker crashed: SIGSEGV", "B=1 Hq=1 Lq=1 Lk=1 Dk=8 float32 dropout_p=0.5", eff)),
        ],
        "observations": [
            {"clause": "ATTN-NAN-1", "implementation": math_, "key": "nan_in_attended_query",
             "value": "finite output (NaN lost)", "case": "B=1 Hq=1 Lq=2 Lk=3 float32"},
        ],
        "panel": {math_: panel({"P01": 0.0, "P02": 0.0, "P03": 0.0}, 1e-6),
                  eff: panel({"P01": 5e-7, "P02": 0.5}, 1e-6)},
        "clause_coverage": {"ATTN-OP-1": {"passed": 2, "run": 2, "total": 2},
                            "ATTN-EMPTY-1": {"passed": 0, "run": 1, "total": 1},
                            "ATTN-GQA-1": {"passed": 1, "run": 2, "total": 2},
                            "ATTN-DROP-1": {"passed": 0, "run": 1, "total": 1}},
        "divergences": [{"id": "TORCH-EMPTY-NAN", "clause": "ATTN-EMPTY-1", "kind": "divergent",
                         "region": "fully_masked_rows",
                         "reason": "the math backend returns NaN for rows with no visible key",
                         "link": "https://github.com/pytorch/pytorch/issues/41508",
                         "observed": True, "witness": "ok"}],
        "verdict": {"verdict": "NONCONFORMANT", "divergences": ["TORCH-EMPTY-NAN"],
                    "failed_clauses": ["ATTN-GQA-1", "ATTN-DROP-1"]},
    }


def jax_cpu() -> dict[str, Any]:
    impl = "jax:xla"
    return {
        "schema_version": 1, "run_id": "jax-cpu-20261122T121000-cccccc", "created": "2026-11-22T12:10:00Z",
        "environment": environment("jax", "cpu", [impl]),
        "records": [
            record("test_output_matches_reference", ["ATTN-OP-1", "ATTN-TOL-1"], impl,
                   ratios=ratios(float32=0.55, bfloat16=0.73), samples=samples("bfloat16", 1.1)),
            record("test_fully_masked_rows", ["ATTN-EMPTY-1"], impl, divergences=["JAX-EMPTY-MEAN"],
                   examples_divergent=4),
        ],
        "observations": [{"clause": "ATTN-NAN-2", "implementation": impl, "key": "nan_at_masked_key",
                          "value": "no effect", "case": None}],
        "panel": {impl: panel({"P01": 2e-7, "P02": 0.0, "P03": 0.0}, 1e-6, nan_moves=True)},
        "clause_coverage": {"ATTN-OP-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-EMPTY-1": {"passed": 1, "run": 1, "total": 1}},
        "divergences": [{"id": "JAX-EMPTY-MEAN", "clause": "ATTN-EMPTY-1", "kind": "divergent",
                         "region": "fully_masked_rows",
                         "reason": "fully-masked rows output the mean of V", "link": None,
                         "observed": True, "witness": "ok"}],
        "verdict": {"verdict": "CONFORMANT_WITH_DIVERGENCES", "divergences": ["JAX-EMPTY-MEAN"],
                    "failed_clauses": []},
    }


def kernel_cuda() -> dict[str, Any]:
    """A third-party kernel whose names and messages try to inject markup."""
    impl = f"kernel:{XSS}"
    return {
        "schema_version": 1, "run_id": "torch-cuda-20261122T121500-dddddd", "created": "2026-11-22T12:15:00Z",
        "environment": environment("torch", "cuda", [impl], kernel=f"evil_pkg.attn:{XSS}"),
        "records": [
            record("test_output_matches_reference", ["ATTN-OP-1", "ATTN-TOL-1"], impl,
                   ratios=ratios(float16=0.95, bfloat16=0.88), samples=samples("float16", 1.8)),
            record("test_boolean_mask", ["ATTN-MASK-1"], impl, status="fail", ratios=ratios(float16=3.0),
                   **failure(f"mismatch <img src=x onerror=alert(2)> {XSS}", f"case with {XSS}", "kernel_x")),
            record("test_fully_masked_rows", ["ATTN-EMPTY-1"], impl),
        ],
        "observations": [{"clause": "ATTN-OP-7", "implementation": impl, "key": "bitwise_deterministic",
                          "value": XSS, "case": XSS}],
        "panel": {impl: panel({"P01": 0.0, "P02": 0.0, "P03": 0.0}, 2e-3)},
        "clause_coverage": {"ATTN-OP-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-TOL-1": {"passed": 1, "run": 1, "total": 1},
                            "ATTN-MASK-1": {"passed": 0, "run": 1, "total": 1},
                            "ATTN-EMPTY-1": {"passed": 1, "run": 1, "total": 1}},
        "divergences": [],
        "verdict": {"verdict": "NONCONFORMANT", "divergences": [], "failed_clauses": ["ATTN-MASK-1"]},
    }


_STATE = {"pass": "conformant", "divergent": "divergent", "unsupported": "unsupported", "fail": "failing",
          "crashed": "failing", "timeout": "failing", "error": "failing"}
_RANK = {"failing": 5, "divergent": 4, "conformant": 2, "unsupported": 1}


def upgrade(run: dict[str, Any]) -> dict[str, Any]:
    """Schema 2: the cells (implementation x clause x dtype) a v2 run file lists, derived here from the
    records the way the plugin's cells would come out for such records (their ratios name the dtypes)."""
    run = json.loads(json.dumps(run))
    run["schema_version"] = 2
    run["complete"] = True
    run["duration_s"] = 12.5
    run.pop("clause_coverage", None)
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rec in run["records"]:
        rec.setdefault("dtype", None)
        rec.setdefault("failed_clause", rec["clauses"][0] if rec["status"] in ("fail", "crashed", "timeout") else None)
        state = _STATE[rec["status"]] if rec["status"] in _STATE else "conformant"
        if state == "conformant" and rec.get("divergences"):
            state = "divergent"
        for dtype in sorted(rec.get("ratios") or {}) or ["any"]:
            for clause in rec["clauses"]:
                key = (rec["implementation"], clause, dtype)
                cell = cells.setdefault(key, {"implementation": key[0], "clause": clause, "dtype": dtype,
                                              "status": state, "checked": 0, "divergent": 0, "unsupported": 0,
                                              "failed": 0, "not_run": 0, "tests": [], "divergences": [],
                                              "first_failure": None, "unsupported_reasons": []})
                if _RANK[state] > _RANK[cell["status"]]:
                    cell["status"] = state
                cell["tests"].append(rec["test"])
                cell["checked"] += int(((rec.get("ratios") or {}).get(dtype) or {}).get("cases") or 3)
                cell["divergences"] += [d for d in rec.get("divergences", []) if d not in cell["divergences"]]
                if state == "divergent":
                    cell["divergent"] += 1
                if state == "unsupported":
                    cell["unsupported_reasons"] += rec.get("unsupported_reasons") or []
                if state == "failing" and cell["first_failure"] is None:
                    cell["failed"] += 1
                    cell["first_failure"] = {"test": rec["test"], "nodeid": rec["nodeid"], "status": rec["status"],
                                             "message": rec.get("message"), "case": rec.get("case"),
                                             "replay": rec.get("replay")}
    run["cells"] = list(cells.values())
    v = run["verdict"]
    v.setdefault("failures", [{"clause": c["clause"], "dtype": c["dtype"], "implementation": c["implementation"],
                               **c["first_failure"]} for c in run["cells"] if c["first_failure"]])
    v.update(incomplete_reasons=[], missing=[], stale=[], floor=3)
    for d in run.get("divergences") or []:
        d.update(instead="mean_of_values", quantities=["out"], dtypes=[], holds=True, condition="unconditional",
                 witness_status="diverges as declared", witness_detail="")
    return run


def bad_files() -> dict[str, Any]:
    future = upgrade(numpy_cpu())
    future["schema_version"] = 3
    weird = upgrade(numpy_cpu())
    weird["records"][0]["status"] = "weird"
    silent = upgrade(torch_cpu())
    silent["records"][3]["message"] = None
    return {"bad-version.json": future, "bad-status.json": weird, "bad-missing-message.json": silent}


def generate() -> dict[str, str]:
    good = {"numpy-cpu.json": upgrade(numpy_cpu()), "torch-cpu.json": upgrade(torch_cpu()),
            "jax-cpu.json": upgrade(jax_cpu()), "kernel-cuda.json": upgrade(kernel_cuda())}
    files = {**good, **bad_files()}
    return {name: json.dumps(runfile.encode(obj), indent=1, ensure_ascii=False) + "\n" for name, obj in files.items()}


GOOD = ["numpy-cpu.json", "torch-cpu.json", "jax-cpu.json", "kernel-cuda.json"]


def test_fixtures_are_generated_by_this_module() -> None:
    for name, text in generate().items():
        assert (FIXTURES / name).read_text(encoding="utf-8") == text, f"regenerate {name}"


def test_good_fixtures_validate() -> None:
    for name in GOOD:
        runfile.load(FIXTURES / name)


if __name__ == "__main__":
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (FIXTURES / name).write_text(text, encoding="utf-8")
        print("wrote", FIXTURES / name)
