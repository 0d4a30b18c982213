"""Run every torch attention path on CUDA over a grid of cases and judge it against the oracle.

Not a pytest module: a script for a lent GPU machine (system python3 with torch,
numpy, ml_dtypes). It uses the suite's own adapters, float64 reference,
dtype-emulated baseline and tolerance model, so a verdict here means what it
means in the conformance run. Each forced backend (MATH, FLASH, EFFICIENT,
CUDNN) and compiled flex_attention runs fp16/bf16/fp32 (MATH also float64)
with TF32 off, then the float32 cases again with TF32 on. Results are written
to $OUT/torch-verify.json after every case, so a run cut short still reports.

    python3 tests/gpu/verify_torch_cuda.py [--device cpu] [--budget SECONDS] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attnconf import adapters  # noqa: E402
from attnconf.conformance.engine import tolerance as T  # noqa: E402
from attnconf.reference import Case, oracle  # noqa: E402

warnings.simplefilter("ignore")


def make(rng, B=1, H=4, Hkv=None, Lq=64, Lk=64, D=64, Dv=None, dtype="float16", **kw) -> Case:
    Hkv, Dv = Hkv or H, Dv or D
    return Case.build(rng.standard_normal((B, H, Lq, D)), rng.standard_normal((B, Hkv, Lk, D)),
                      rng.standard_normal((B, Hkv, Lk, Dv)), grad_out=rng.standard_normal((B, H, Lq, Dv)),
                      dtype=dtype, **kw)


def grid(dtype: str, rng) -> list[tuple[str, Case, bool]]:
    """(label, case, with_grads)."""
    out = []
    for D in (40, 80, 96, 128, 256):
        for L in (97, 129):
            out.append((f"plain D={D} L={L}", make(rng, B=2, H=2, Lq=L, Lk=L, D=D, dtype=dtype), D in (64, 128)))
    out.append(("plain D=128 L=1025", make(rng, B=1, H=2, Lq=1025, Lk=1025, D=128, dtype=dtype), False))
    out.append(("causal top_left D=128 L=1025", make(rng, B=1, H=2, Lq=1025, Lk=1025, D=128, dtype=dtype,
                                                     causal="top_left"), True))
    out.append(("causal top_left Lq=97 Lk=129", make(rng, Lq=97, Lk=129, D=64, dtype=dtype, causal="top_left"), True))
    out.append(("causal bottom_right Lq=97 Lk=129", make(rng, Lq=97, Lk=129, D=64, dtype=dtype,
                                                         causal="bottom_right"), True))
    out.append(("causal bottom_right Lq=129 Lk=97 (empty rows)", make(rng, Lq=129, Lk=97, D=64, dtype=dtype,
                                                                     causal="bottom_right"), True))
    m = rng.random((2, 1, 97, 129)) > 0.3
    m[0, 0, 5] = False
    m[1, 0, 60:64] = False
    out.append(("bool mask, fully-masked rows", make(rng, B=2, Lq=97, Lk=129, D=64, dtype=dtype, mask=m), True))
    m2 = rng.random((2, 1, 97, 129)) > 0.3
    m2[:, :, :, 0] = True
    out.append(("bool mask, no empty rows", make(rng, B=2, Lq=97, Lk=129, D=64, dtype=dtype, mask=m2), True))
    out.append(("bias (1,H,Lq,Lk)", make(rng, Lq=97, Lk=129, D=64, dtype=dtype,
                                         bias=rng.standard_normal((1, 4, 97, 129))), True))
    b = rng.standard_normal((2, 4, 97, 129))
    b[0, 1, 7] = -np.inf
    out.append(("bias with -inf row", make(rng, B=2, Lq=97, Lk=129, D=64, dtype=dtype, bias=b), True))
    out.append(("bias + causal bottom_right", make(rng, Lq=97, Lk=129, D=64, dtype=dtype,
                                                   bias=rng.standard_normal((97, 129)), causal="bottom_right"), True))
    out.append(("padding q/kv lengths", make(rng, B=3, Lq=97, Lk=129, D=64, dtype=dtype,
                                             q_lengths=np.array([97, 50, 1]), kv_lengths=np.array([129, 33, 0])), True))
    out.append(("GQA Hq=8 Hkv=2", make(rng, H=8, Hkv=2, Lq=97, Lk=129, D=64, dtype=dtype), True))
    out.append(("MQA Hq=8 Hkv=1 causal", make(rng, H=8, Hkv=1, Lq=129, Lk=129, D=128, dtype=dtype,
                                              causal="top_left"), True))
    out.append(("custom scale 0.05, Dv=32", make(rng, Lq=97, Lk=129, D=64, Dv=32, dtype=dtype, scale=0.05), False))
    out.append(("noncontiguous", make(rng, B=2, Lq=97, Lk=129, D=64, dtype=dtype, layout="noncontiguous"), True))
    for Lk in (33, 97, 129, 65):  # pytorch#191937: EFFICIENT with stride-0 K/V and Lk % 32 == 1
        c = make(rng, B=3, Lq=64, Lk=Lk, D=64, dtype=dtype)
        c = c.replace(k=np.repeat(c.k[:1], 3, 0), v=np.repeat(c.v[:1], 3, 0), layout="broadcast_kv")
        out.append((f"broadcast_kv Lk={Lk}", c, Lk == 33))
    return out


FLEX_LABELS = ("causal bottom_right Lq=129 Lk=97 (empty rows)", "bool mask, fully-masked rows", "bias with -inf row",
               "padding q/kv lengths", "GQA Hq=8 Hkv=2")


def judge(a, case: Case, grads: bool) -> dict:
    rec: dict = {}
    ok = a.supports(case)
    if ok is not True:
        return {"status": "unsupported", "reason": ok}
    g_ok = a.supports(case, need=frozenset({"grads"})) is True if grads else False
    t0 = time.time()
    try:
        res = a.run(case, grads=g_ok)
    except adapters.base.NotSupported as exc:
        return {"status": "unsupported", "reason": f"at run time: {exc}"}
    except Exception as exc:  # noqa: BLE001 (recorded, not raised)
        return {"status": "error", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
    rec["seconds"] = round(time.time() - t0, 3)
    rec["kernel"] = res.kernel
    j = T.judge_output(res.out, case)
    rec.update(out_ok=bool(j.ok), out_ratio=_num(j.ratio_max), out_err=_num(j.e_max), base_err=_num(j.base_max))
    if not j.ok:
        rec["out_reason"] = j.explain()[:400]
    vis = oracle(case).visible
    empty = ~vis.any(axis=-1)
    if empty.any():
        rows = res.out[empty]
        rec["empty_rows"] = "nan" if np.isnan(rows).any() else ("zero" if (rows == 0).all() else "nonzero")
    status_ok = j.ok
    if res.lse is not None:
        jl = T.judge_lse(res.lse, case)
        rec.update(lse_ok=bool(jl.ok), lse_ratio=_num(jl.ratio_max))
        if not jl.ok:
            rec["lse_reason"] = jl.explain()[:300]
        status_ok &= jl.ok
    if g_ok:
        js = T.judge_gradients(res.grads, case)
        rec["grads"] = {x.quantity: {"ok": bool(x.ok), "ratio": _num(x.ratio_max)} for x in js}
        bad = [x.explain()[:300] for x in js if not x.ok]
        if bad:
            rec["grad_reasons"] = bad
        status_ok &= not bad
    elif grads:
        rec["grads"] = "unsupported: " + str(a.supports(case, need=frozenset({"grads"})))[:200]
    rec["status"] = "pass" if status_ok else "fail"
    return rec


def _num(x: float):
    return None if x is None or not np.isfinite(x) else float(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "torch-verify.json"))
    ap.add_argument("--flex-cases", type=int, default=5, help="compiled flex cases per dtype (compiles are slow)")
    ap.add_argument("--flex-budget", type=float, default=40.0, help="seconds of flex (compiles) per dtype")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32,float64", help="dtypes of the TF32-off pass")
    ap.add_argument("--tf32", default="off,on", help="which passes: off, on (on runs float32 only)")
    ap.add_argument("--labels", default="", help="comma-separated label prefixes to keep (default: all)")
    ap.add_argument("--impls", default="", help="comma-separated implementation names to keep (default: all)")
    args = ap.parse_args()
    start = time.time()
    report: dict = {"script": "tests/gpu/verify_torch_cuda.py", "results": [], "complete": False}
    keep = [x for x in args.labels.split(",") if x]
    for tf32 in [m == "on" for m in args.tf32.split(",")]:
        impls = [a for a in adapters.load("torch", device=args.device, options={"allow_tf32": tf32})
                 if a.kind == "sdpa" and (not args.impls or a.name in args.impls.split(","))]
        report.setdefault("environment", {})[f"tf32={tf32}"] = impls[0].describe()
        dtypes = tuple(args.dtypes.split(",")) if not tf32 else ("float32",)
        for dtype in dtypes:
            rng = np.random.default_rng(1234)
            flex_done = 0
            flex_seconds = 0.0
            for label, case, grads in grid(dtype, rng):
                if keep and not any(label.startswith(k) for k in keep):
                    continue
                for a in impls:
                    if time.time() - start > args.budget:
                        report["stopped"] = f"budget {args.budget}s reached"
                        _write(args.out, report)
                        return
                    if a.name == "torch:flex":
                        if (flex_done >= args.flex_cases or dtype not in a.dtypes or label not in FLEX_LABELS
                                or flex_seconds > args.flex_budget):
                            continue
                    if dtype == "float64" and a.name != "torch:sdpa-math":
                        continue
                    t0 = time.time()
                    try:
                        rec = judge(a, case, grads and not tf32)
                    except Exception:  # noqa: BLE001
                        rec = {"status": "error", "reason": traceback.format_exc()[-600:]}
                    if a.name == "torch:flex":
                        flex_done += rec["status"] != "unsupported"
                        flex_seconds += time.time() - t0
                    rec.update(impl=a.name, tf32=tf32, dtype=dtype, label=label, case=case.summary())
                    report["results"].append(rec)
                    print(f"{a.name:22} tf32={tf32!s:5} {dtype:8} {label:45} {rec['status']:11} "
                          f"{rec.get('out_ratio', '')!s:.6} {rec.get('reason', rec.get('out_reason', ''))[:80]}",
                          flush=True)
                _write(args.out, report)
    report["complete"] = True
    report["seconds"] = round(time.time() - start, 1)
    _write(args.out, report)


def _write(path: str, report: dict) -> None:
    summary: dict = {}
    for r in report["results"]:
        key = f"{r['impl']} tf32={r['tf32']} {r['dtype']}"
        s = summary.setdefault(key, {"pass": 0, "fail": 0, "unsupported": 0, "error": 0, "max_out_ratio": 0.0})
        s[r["status"]] += 1
        if r.get("out_ratio") is not None:
            s["max_out_ratio"] = max(s["max_out_ratio"], r["out_ratio"])
    report["summary"] = summary
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
