"""Check jax.nn.dot_product_attention (xla and cudnn) on a GPU against the float64 reference.

Self-contained apart from the repository's `reference` package, so it runs on a
bare GPU machine with system JAX:  `python3 tests/gpu/verify_jax_cuda.py OUT.json`.
On a machine without a GPU it runs the xla grid on CPU (cudnn rows say why not).

Criterion (ATTN-TOL-1): on rows that see at least one key,
    max|O - O_ref| <= 2 * max|O_naive - O_ref| + 2 * max rounding_noise(O_ref, t)
with O_naive the dtype-emulated naive attention (`reference.naive_forward`).
float64 is held to the analytic bound of ATTN-TOL-4. A cuDNN run counts only if
the compiled HLO contains `__cudnn$fmha`; a raise at trace time is recorded as
unsupported with its message. Rows that see no key are recorded separately as
zero / mean-of-V / NaN / other, since that is a spec rule, not a tolerance.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

from attnconf.reference import Case, causal_visible, naive_forward, oracle, round_to  # noqa: E402
from attnconf.reference.attention import expand_kv  # noqa: E402

MARK = "__cudnn$fmha"
DEADLINE = time.time() + float(os.environ.get("VERIFY_BUDGET_S", "300"))


# ---- translation (mirrors adapters/jax/translate.py, kept local on purpose) ----
def jax_args(case: Case, full_bias: bool):
    s = case.shape
    t = {"bfloat16": jnp.bfloat16}.get(case.dtype, case.dtype)
    sw = lambda x: jnp.asarray(np.swapaxes(x, 1, 2), dtype=t)  # noqa: E731
    mask = None if case.mask is None else np.asarray(case.mask, bool).reshape((1,) * (4 - case.mask.ndim) + case.mask.shape)
    is_causal = case.causal == "top_left"
    if case.causal == "bottom_right":
        br = np.stack([causal_visible(s["Lq"], s["Lk"], "bottom_right",
                                      None if case.q_lengths is None else int(case.q_lengths[b]),
                                      None if case.kv_lengths is None else int(case.kv_lengths[b]))
                       for b in range(s["B"])])[:, None]
        mask = br if mask is None else mask & br
    bias = None if case.bias is None else case.bias.reshape((1,) * (4 - case.bias.ndim) + case.bias.shape)
    if full_bias:
        bias = None if bias is None else np.broadcast_to(bias, bias.shape[:2] + (s["Lq"], s["Lk"]))
        mask = None if mask is None else np.broadcast_to(mask, mask.shape[:2] + (s["Lq"], s["Lk"]))
    args = (sw(case.q), sw(case.k), sw(case.v),
            None if bias is None else jnp.asarray(bias, dtype=t),
            None if mask is None else jnp.asarray(mask),
            None if case.q_lengths is None else jnp.asarray(case.q_lengths, jnp.int32),
            None if case.kv_lengths is None else jnp.asarray(case.kv_lengths, jnp.int32))
    return args, dict(is_causal=is_causal, scale=case.scale)


def _attend(q, k, v, bias, mask, ql, kl, *, is_causal, scale, impl):
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                        query_seq_lengths=ql, key_value_seq_lengths=kl, implementation=impl)


attend = jax.jit(_attend, static_argnames=("is_causal", "scale", "impl"))


def _loss_grads(q, k, v, bias, mask, ql, kl, do, *, is_causal, scale, impl):
    def f(q, k, v):
        return _attend(q, k, v, bias, mask, ql, kl, is_causal=is_causal, scale=scale, impl=impl)
    _, pull = jax.vjp(f, q, k, v)
    return pull(do)


grads_fn = jax.jit(_loss_grads, static_argnames=("is_causal", "scale", "impl"))


# ---- judging ----
def noise(x, dtype):
    x = round_to(x, dtype)
    return np.abs(round_to(round_to(x + 0.3, dtype) - 0.3, dtype) - x)


def judge(out: np.ndarray, case: Case) -> dict:
    f = oracle(case)
    rows = f.visible.any(-1)                     # (B, H, Lq)
    r = {}
    if rows.any():
        err = np.abs(out - f.out)[rows]
        r["nonfinite"] = int((~np.isfinite(out[rows])).sum())
        r["err"] = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
        if case.dtype == "float64":
            hq = case.shape["Hq"]
            mag = abs(case.effective_scale) * np.einsum("bhid,bhjd->bhij", np.abs(case.q), np.abs(expand_kv(case.k, hq)))
            a = np.where(f.visible, mag, 0).max(-1)
            vmax = np.where(f.visible, np.abs(expand_kv(case.v, hq)).max(-1)[:, :, None, :], 0).max(-1)
            s = case.shape
            bound = 2 * np.finfo(float).eps * vmax * ((s["Dk"] + 2) * a + 2 * s["Lk"] + 4)
            row_err = np.abs(out - f.out).max(-1)
            r["allowed"] = float(bound[rows].max())
            r["ratio"] = float((row_err[rows] / bound[rows]).max())
            r["pass"] = bool(r["nonfinite"] == 0 and (row_err[rows] <= bound[rows]).all())
        else:
            base, _ = naive_forward(case)
            b = float(np.abs(base - f.out)[rows].max())
            fl = 2 * float(noise(f.out[rows], case.dtype).max())
            r.update(base=b, floor=fl, allowed=2 * b + fl, ratio=r["err"] / b if b else float("inf"))
            r["pass"] = bool(r["nonfinite"] == 0 and r["err"] <= 2 * b + fl)
    empty = ~rows
    if empty.any():
        ve = expand_kv(case.v, case.shape["Hq"])
        mean_v = np.broadcast_to(ve.mean(axis=2, keepdims=True), out.shape)
        o = out[empty]
        if np.isnan(o).any():
            beh = "nan"
        elif np.abs(o).max() == 0:
            beh = "zero"
        elif np.abs(o - mean_v[empty]).max() <= 1e-2 * (np.abs(mean_v[empty]).max() + 1e-6):
            beh = "mean_of_v"
        else:
            beh = "other"
        r["empty_rows"] = int(empty.sum())
        r["empty_behaviour"] = beh
        r["empty_max_abs"] = float(np.nanmax(np.abs(o))) if not np.isnan(o).all() else float("nan")
    return r


# ---- the grid ----
def make_case(rng, dtype, d, kind, lq, lk, b=2, h=4):
    hkv = 1 if kind == "gqa_mqa" else (2 if kind == "gqa" else h)
    q = rng.standard_normal((b, h, lq, d))
    k = rng.standard_normal((b, hkv, lk, d))
    v = rng.standard_normal((b, hkv, lk, d))
    p: dict = {}
    if kind == "mask":
        m = rng.random((b, 1, lq, lk)) > 0.3
        m[..., 0] = True
        p["mask"] = m
    elif kind == "bias":
        p["bias"] = rng.standard_normal((1, h, lq, lk))
    elif kind == "mask_bias":
        m = rng.random((b, h, lq, lk)) > 0.3
        m[..., 0] = True
        p.update(mask=m, bias=rng.standard_normal((b, 1, lq, lk)))
    elif kind == "causal_tl":
        p["causal"] = "top_left"
    elif kind == "causal_br":
        p["causal"] = "bottom_right"
    elif kind == "causal_mask":
        m = rng.random((b, 1, lq, lk)) > 0.3
        m[..., 0] = True
        p.update(causal="top_left", mask=m)
    elif kind == "kv_pad":
        p["kv_lengths"] = [lk, max(1, lk // 3)]
    elif kind == "q_pad":
        p["q_lengths"] = [lq, max(1, lq // 2)]
    elif kind == "fully_masked_row":
        m = np.ones((b, 1, lq, lk), bool)
        m[:, :, 1] = False
        p["mask"] = m
    elif kind == "scale":
        p["scale"] = 0.3
    return Case.build(q, k, v, dtype=dtype, **p)


def run_one(case: Case, impl: str, precision: str) -> dict:
    rec = {"impl": impl, "precision": precision, **{k: v for k, v in case.shape.items()},
           "dtype": case.dtype, "mask": case.mask_kind()}
    args, st = jax_args(case, full_bias=impl == "cudnn")
    ctx = jax.default_matmul_precision("highest") if precision == "highest" else _null()
    try:
        with ctx:
            if case.dtype == "float16" and jax.default_backend() == "cpu":
                text, out = "(eager: jit raises for float16 on CPU)", _attend(*args, **st, impl=impl)
            else:
                compiled = attend.lower(*args, **st, impl=impl).compile()
                text, out = compiled.as_text(), compiled(*args)
    except Exception as exc:  # cudnn raises for what it cannot run
        rec.update(status="unsupported" if impl == "cudnn" else "error",
                   reason=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}")
        return rec
    rec["cudnn_in_hlo"] = MARK in text
    if impl == "cudnn" and not rec["cudnn_in_hlo"]:
        rec.update(status="unsupported", reason="no __cudnn$fmha in compiled HLO")
        return rec
    rec["out_dtype"] = str(out.dtype)
    rec.update(judge(np.swapaxes(np.asarray(out, dtype=np.float64), 1, 2), case))
    rec["status"] = "pass" if rec.get("pass", True) else "fail"
    return rec


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def grid(platform: str) -> list[dict]:
    rng = np.random.default_rng(0)
    dtypes = ["float16", "bfloat16", "float32"] + (["float64"] if platform == "cpu" else [])
    impls = ["xla", "cudnn"] if platform == "gpu" else ["xla"]
    kinds_all = ["none", "mask", "bias", "mask_bias", "causal_tl", "causal_br", "causal_mask", "kv_pad", "q_pad",
                 "gqa", "gqa_mqa", "fully_masked_row", "scale"]
    recs = []
    dims = [int(x) for x in os.environ.get("VERIFY_HEAD_DIMS", "64,128,96,40").split(",")]
    for d in dims:
        kinds = kinds_all if d in (64, 128) else ["none", "causal_tl", "mask", "gqa", "fully_masked_row"]
        for lq, lk in ((128, 128), (37, 61), (61, 37)):
            for kind in kinds:
                for dtype in dtypes:
                    case = make_case(rng, dtype, d, kind, lq, lk)
                    for impl in impls:
                        precs = ["highest", "default"] if dtype == "float32" else ["highest"]
                        for prec in precs:
                            if time.time() > DEADLINE:
                                recs.append({"status": "skipped", "reason": "time budget"})
                                return recs
                            recs.append(run_one(case, impl, prec) | {"kind": kind})
    return recs


def probes(platform: str) -> list[dict]:
    """Special inputs: large logits, NaN, -inf bias rows, float64 precision, grads."""
    rng = np.random.default_rng(1)
    impls = ["xla", "cudnn"] if platform == "gpu" else ["xla"]
    out = []
    b, h, l, d = 1, 2, 16, 64
    q, k, v = rng.standard_normal((b, h, l, d)), rng.standard_normal((b, h, l, d)), rng.standard_normal((b, h, l, d))
    for dtype in ["float16", "bfloat16", "float32"]:
        for impl in impls:
            # large logits: scale so that logits reach ~1e4
            c = Case.build(q, k, v, dtype=dtype, scale=1e4 / np.abs(q @ np.swapaxes(k, -1, -2)).max())
            out.append(run_one(c, impl, "highest") | {"kind": "large_logits_1e4"})
            # whole row -inf bias (no bool mask)
            bias = np.zeros((1, 1, l, l))
            bias[..., 2, :] = -np.inf
            out.append(run_one(Case.build(q, k, v, dtype=dtype, bias=bias), impl, "highest") | {"kind": "neg_inf_bias_row"})
            # NaN in an attended key / a masked key / a masked value
            for where in ("k_attended", "k_masked", "v_masked"):
                kk, vv = k.copy(), v.copy()
                m = np.ones((1, 1, l, l), bool)
                m[..., 5] = False
                if where == "k_attended":
                    kk[0, 0, 3, 0] = np.nan
                elif where == "k_masked":
                    kk[0, 0, 5, 0] = np.nan
                else:
                    vv[0, 0, 5, 0] = np.nan
                c = Case.build(q, kk, vv, dtype=dtype, mask=m)
                r = run_one(c, impl, "highest")
                args, st = jax_args(c, full_bias=impl == "cudnn")
                try:
                    fn = _attend if dtype == "float16" and platform == "cpu" else attend
                    o = np.asarray(fn(*args, **st, impl=impl), dtype=np.float64)
                    r["nan_rows_head0"] = int(np.isnan(o[0, :, 0]).any(-1).sum())
                except Exception:
                    pass
                out.append(r | {"kind": f"nan_{where}"})
            # gradients (cudnn backward included) on one ordinary case
            c = Case.build(q, k, v, dtype=dtype, causal="top_left", grad_out=rng.standard_normal((b, h, l, d)))
            out.append(grad_probe(c, impl))
    c = Case.build(q, k, v, dtype="float64")
    out.append(run_one(c, "xla", "highest") | {"kind": "float64_precision"})
    return out


def grad_probe(case: Case, impl: str) -> dict:
    from attnconf.reference.backward import backward
    from attnconf.reference.emulate_backward import naive_backward

    rec = {"impl": impl, "kind": "grads", "dtype": case.dtype, "mask": case.mask_kind()}
    args, st = jax_args(case, full_bias=impl == "cudnn")
    t = {"bfloat16": jnp.bfloat16}.get(case.dtype, case.dtype)
    do = jnp.asarray(np.swapaxes(case.grad_out, 1, 2), dtype=t)
    try:
        with jax.default_matmul_precision("highest"):
            text = grads_fn.lower(*args, do, **st, impl=impl).compile().as_text()
            g = grads_fn(*args, do, **st, impl=impl)
    except Exception as exc:
        rec.update(status="unsupported" if impl == "cudnn" else "error",
                   reason=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
        return rec
    rec["cudnn_in_hlo"] = MARK in text
    ref, base = backward(case), naive_backward(case)
    ok = True
    for name, x in zip(("dq", "dk", "dv"), g):
        x = np.swapaxes(np.asarray(x, dtype=np.float64), 1, 2)
        r = getattr(ref, name)
        e, bb = float(np.abs(x - r).max()), float(np.abs(base[name] - r).max())
        fl = 2 * float(noise(r, case.dtype).max())
        rec[name] = {"err": e, "base": bb, "allowed": 3 * bb + fl}
        ok &= e <= 3 * bb + fl
    rec["status"] = "pass" if ok else "fail"
    return rec


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "jax-verify.json")
    platform = jax.default_backend()
    platform = "gpu" if platform in ("gpu", "cuda") else platform
    t0 = time.time()
    info = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()], "platform": platform,
            "x64": bool(jax.config.read("jax_enable_x64"))}
    try:
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
        info["device_kind"] = jax.devices()[0].device_kind
    except Exception:
        pass
    recs, errors = [], []
    parts = (probes, grid) if os.environ.get("VERIFY_PROBES", "1") == "1" else (grid,)
    for part in parts:
        try:
            recs += part(platform)
        except Exception:
            errors.append(traceback.format_exc()[-2000:])
        path.write_text(json.dumps({"info": info, "records": recs, "errors": errors}, indent=1, default=str))
    summary: dict = {}
    for r in recs:
        key = f"{r.get('impl')}/{r.get('precision', '-')}/{r.get('dtype')}"
        s = summary.setdefault(key, {})
        s[r["status"]] = s.get(r["status"], 0) + 1
    info["seconds"] = round(time.time() - t0, 1)
    path.write_text(json.dumps({"info": info, "summary": summary, "records": recs, "errors": errors},
                               indent=1, default=str))
    print(json.dumps({"info": info, "summary": summary, "errors": errors}, indent=1, default=str))


if __name__ == "__main__":
    main()
