"""Every shape boundary of boundaries.py in every family of inputs, as fixed cases.

A boundary drawn at random by `strategies.shapes()` reaches a family (sinks, ALiBi, windows, GQA,
gradients) only by chance: one ci run of the reference measured 0 crossings of the GQA-packing, batch
blocking and 512/576 head-dim boundaries by the ALiBi cases, and none of most boundaries by the gradient
cases. Yet real kernels put exactly those combinations on separate code paths (sinks added on the split-KV
merge, ALiBi on the packed-GQA path, the backward of the second 256-wide query tile), so a defect there
hides from every random draw. `branch_cases(dtype)` builds the boundary x family grid once, deterministically:
the suite's test_branch_points.py runs it in every cell, and tests/test_boundaries.py counts it.

The families follow what kernels branch on, not a size budget:
- plain: the boundary's own shape, no mask;
- gqa: the same shape with one KV head per group of query heads (shapes that already group stay as they are);
- window: a sliding window (Lk // 3 keys back, none ahead) across the key tiles;
- alibi: the geometric schedule with alternating signs and one slope above 1 (negative slopes make far keys
  dominate, which a kernel that clamps or drops the sign gets wrong), lse judged where returned;
- sinks: per-head sink logits at, above and below each head's typical lse (they change the result);
- gradients: dO drawn from the case's seed (backward kernels tile the same dimensions);
- causal_gradients: the gradients of the causal case (a backward kernel skips the blocks above the diagonal
  on its own path);
- causal: bottom-right causal (split-KV decode kernels mask the last Lq - 1 keys on their own path: a kernel that
  drops causal only when it splits passed the whole ci suite before this family, tests/kernels/branch_bugs.py).
"""
from __future__ import annotations

import zlib

import numpy as np

from attnconf.conformance.strategies.boundaries import BOUNDARIES, Boundary
from attnconf.conformance.strategies.pins import fixed_case
from attnconf.conformance.strategies.values import geometric_slopes
from attnconf.reference import Case, oracle

BRANCH_FAMILIES = ("plain", "gqa", "window", "alibi", "sinks", "gradients", "causal", "causal_gradients")
SINK_OFFSETS = (0.0, 5.0, -5.0, 1.0)       # sink minus the head's median lse: comparable, dominant, negligible


def alibi_schedule(hq: int) -> np.ndarray:
    """Geometric slopes with alternating signs, the first head's negative; with two or more heads, the last one
    steep (2.0). Two heads (most boundary shapes) give (-1/16, 2): a negative slope at every boundary."""
    slopes = geometric_slopes(hq) * np.where(np.arange(hq) % 2, 1.0, -1.0)
    if hq >= 2:
        slopes[-1] = 2.0
    return slopes if hq > 1 else np.array([-0.5])


def sinks_for(case: Case) -> np.ndarray:
    """One sink per query head, offset from that head's median finite lse by SINK_OFFSETS in turn."""
    lse = oracle(case.replace(sinks=None)).lse
    hq = case.shape["Hq"]
    centre = np.array([np.median(lse[:, h][np.isfinite(lse[:, h])]) if np.isfinite(lse[:, h]).any() else 0.0
                       for h in range(hq)])
    sinks = centre + np.resize(np.array(SINK_OFFSETS), hq)
    return np.clip(sinks, -6e4, 6e4) if case.dtype == "float16" else sinks


def _grouped(shape: dict[str, int]) -> dict[str, int]:
    if shape["Hq"] > shape["Hkv"]:
        return shape
    return {**shape, "Hq": max(2, shape["Hq"]), "Hkv": 1}


def branch_case(b: Boundary, family: str, dtype: str) -> Case:
    """The case of boundary `b` in `family` (BRANCH_FAMILIES), in `dtype`; its seed names both."""
    seed = zlib.crc32(f"{b.id}|{family}".encode()) % 2**31
    shape = _grouped(b.shape) if family == "gqa" else dict(b.shape)
    case = fixed_case(seed, dtype=dtype, **shape)
    s = case.shape
    if family == "window":
        return case.replace(window=(max(1, s["Lk"] // 3), 0), window_align="bottom_right")
    if family == "alibi":
        return case.replace(alibi_slopes=alibi_schedule(s["Hq"]))
    if family == "sinks":
        return case.replace(sinks=sinks_for(case))
    if family == "causal":
        return case.replace(causal="bottom_right")
    if family in ("gradients", "causal_gradients"):
        rng = np.random.default_rng([seed, 7])
        return case.replace(grad_out=rng.normal(size=(s["B"], s["Hq"], s["Lq"], s["Dv"])),
                            causal="bottom_right" if family == "causal_gradients" else None)
    return case


def branch_grid(dtype: str) -> list[tuple[str, str, Case]]:
    """(boundary id, family, case) for every boundary and family, skipping a gqa family that would repeat the
    boundary's own (already grouped) shape."""
    return [(b.id, f, branch_case(b, f, dtype)) for b in BOUNDARIES for f in BRANCH_FAMILIES
            if not (f == "gqa" and b.shape["Hq"] > b.shape["Hkv"])]


def where(case: Case) -> str:
    """'boundary / family' of a grid case, from its seed (for failure messages), or '' for any other case."""
    return _BY_SEED.get(case.seed, "")


_BY_SEED = {zlib.crc32(f"{b.id}|{f}".encode()) % 2**31: f"branch point {b.id} ({b.why}), family {f}"
            for b in BOUNDARIES for f in BRANCH_FAMILIES}
