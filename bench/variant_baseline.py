"""How large the naive baseline's error is for each variant (window, softcap, ALiBi, sinks) and dtype,
and where an honest flash-style kernel sits against it (the numbers quoted in SPEC section 12.5).

For each dtype and variant, N seeded cases (B=2, Hq=4, Hkv=2, Lq=64, Lk=96, D=32, ordinary values)
are built; for each case it prints, as medians and maxima over the cases:

- base/eps: the baseline envelope's max error (27 variants) over eps_t * max|V|;
- flash/base: the max error of a flash-style kernel emulated in NumPy (logits, cap, ALiBi and the
  softmax in float32, P rounded to t before P V as flash-attention does, float32 accumulation, output
  rounded once) over the baseline envelope's max error: what ATTN-TOL-1 compares with c_max = 2.

    .venv/bin/python -m bench.variant_baseline [N]
"""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from attnconf.reference import Case, baseline_error, expand_kv, numpy_dtype, oracle
from attnconf.reference.attention import alibi_bias

VARIANTS = {
    "plain": {},
    "window": {"window": (16, 4), "window_align": "bottom_right"},
    "window+causal": {"window": (8, -1), "causal": "bottom_right"},
    "softcap": {"softcap": 2.0},
    "alibi": {"alibi": True},
    "sinks": {"sinks": True},
    "all": {"window": (24, 0), "softcap": 3.0, "alibi": True, "sinks": True},
}


def make_case(seed: int, dtype: str, params: dict) -> Case:
    rng = np.random.default_rng(seed)
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 64, 96, 32
    q, k, v = rng.normal(size=(B, Hq, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)), rng.normal(size=(B, Hkv, Lk, D))
    p = dict(params)
    if p.pop("alibi", False):
        p["alibi_slopes"] = 2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)      # the ALiBi paper's slopes
    if p.pop("sinks", False):
        p["sinks"] = rng.normal(size=Hq) + 2.0
    return Case.build(q, k, v, dtype=dtype, seed=seed, **p)


def flash_like(case: Case) -> np.ndarray:
    """A flash-style kernel at the case's dtype: float32 logits/softmax, P rounded to t for P V."""
    t = numpy_dtype(case.dtype)
    f32 = np.float32
    hq = case.shape["Hq"]
    q, k, v = case.q.astype(f32), expand_kv(case.k, hq).astype(f32), expand_kv(case.v, hq).astype(f32)
    s = (q @ np.swapaxes(k, -1, -2)) * f32(case.effective_scale)
    if case.softcap is not None:
        s = f32(case.softcap) * np.tanh(s / f32(case.softcap))
    if case.alibi_slopes is not None:
        s = s + alibi_bias(s.shape, case.alibi_slopes, case.window_align, case.q_lengths,
                           case.kv_lengths).astype(f32)
    vis = oracle(case).visible
    s = np.where(vis, s, -np.inf).astype(f32)
    m = s.max(axis=-1, keepdims=True)
    if case.sinks is not None:
        m = np.maximum(m, case.sinks.astype(f32)[None, :, None, None])
    m = np.where(np.isneginf(m), f32(0), m)
    p = np.where(vis, np.exp(s - m), f32(0)).astype(f32)
    l = p.sum(axis=-1, keepdims=True, dtype=f32)
    if case.sinks is not None:
        l = l + np.exp(case.sinks.astype(f32)[None, :, None, None] - m)
    o = p.astype(t).astype(f32) @ v
    o = np.where(l > 0, o / np.where(l > 0, l, f32(1)), f32(0))
    return o.astype(t).astype(np.float64)


def main(n: int = 8) -> None:
    print(f"{'dtype':9} {'variant':14} {'base/eps med':>12} {'max':>7} {'flash/base med':>14} {'max':>6}")
    for dtype in ("float32", "float16", "bfloat16"):
        eps = float(ml_dtypes.finfo(numpy_dtype(dtype)).eps)
        for name, params in VARIANTS.items():
            rel, ratio = [], []
            for seed in range(n):
                case = make_case(seed, dtype, params)
                ref = oracle(case).out
                vmax = float(np.abs(case.v).max())
                base = float(baseline_error(case)[0].max())
                rel.append(base / (eps * vmax))
                ratio.append(float(np.abs(flash_like(case) - ref).max()) / base)
            print(f"{dtype:9} {name:14} {np.median(rel):12.3g} {max(rel):7.3g} {np.median(ratio):14.3g} {max(ratio):6.3g}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
