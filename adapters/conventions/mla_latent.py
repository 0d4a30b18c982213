"""How a Case becomes MLA's absorbed form: one 576-wide latent row per key, V its first 512 dims.

FlashMLA's kernels (deepseek-ai/FlashMLA `flash_mla/flash_mla_interface.py`) take q and a
single cache of width d_qk = 576 (512 latent + 64 rope dims) and read V as the first
`head_dim_v` = d_v = 512 dims of that same cache: scores use all 576 dims, values only the
first 512. A Case has independent K (Dk) and V (Dv). Two ways onto the kernel:

- native: Dk = 576, Dv = 512 and V equals K[..., :512] bitwise (the absorbed form itself);
  q and the cache are passed as they are;
- embedded (every other case with Dv <= 512 and Dk + Dv <= 576): the cache row is
  [V | zeros | K at offset o | zeros] and the query [zeros | q at offset o | zeros], with
  Dv <= o <= 576 - Dk. The score q'.c equals q.k exactly (the other terms are 0 * x = 0) and
  the first Dv dims of the value slice are V. The offset is drawn from the case seed, so
  that K lands in the latent part, in the rope part, or across the boundary: a kernel that
  drops the rope dims from the score, or reads V from another slice, is caught either way.

An embedded case's inputs must be finite (0 * inf would put NaN in the score). The scale
is passed explicitly for an embedded case (the kernel's default, 1/sqrt(576), is the
native case's spec default only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnconf.reference import Case

D_QK, D_V, D_ROPE = 576, 512, 64


@dataclass
class Latent:
    q: np.ndarray          # (B, Hq, Lq, 576)
    c: np.ndarray          # (B, Hkv, Lk, 576): the key row; its first 512 dims are the value row
    offset: int | None     # where K sits in the embedded form; None = native
    scale: float | None    # what to pass as the kernel's scale (None only for a native default)


def native(case: Case) -> bool:
    s = case.shape
    return s["Dk"] == D_QK and s["Dv"] == D_V and np.array_equal(case.v, case.k[..., :D_V], equal_nan=True)


def expressible(case: Case) -> bool | str:
    """True, or why this case has no latent form."""
    if native(case):
        return True
    s = case.shape
    if s["Dv"] > D_V or s["Dk"] + s["Dv"] > D_QK:
        return (f"Dk = {s['Dk']}, Dv = {s['Dv']}: the latent form needs Dv <= {D_V} and Dk + Dv <= {D_QK} "
                f"(or Dk = {D_QK}, Dv = {D_V} with V = K[..., :{D_V}])")
    if not (np.isfinite(case.q).all() and np.isfinite(case.k).all() and np.isfinite(case.v).all()):
        return "non-finite inputs outside the native latent form (the embedding multiplies them by 0)"
    return True


def latent(case: Case) -> Latent:
    """The case in the absorbed latent form (see the module docstring)."""
    s = case.shape
    if native(case):
        return Latent(case.q, case.k, None, case.scale)
    dk, dv = s["Dk"], s["Dv"]
    offset = case.packing.get("latent_offset")
    if offset is None:
        offset = int(np.random.default_rng([case.seed, 41]).integers(dv, D_QK - dk + 1))
    if not dv <= offset <= D_QK - dk:
        raise ValueError(f"packing latent_offset={offset} must lie in [{dv}, {D_QK - dk}] for Dk={dk}, Dv={dv}")
    q = np.zeros(case.q.shape[:3] + (D_QK,))
    q[..., offset:offset + dk] = case.q
    c = np.zeros(case.k.shape[:3] + (D_QK,))
    c[..., :dv] = case.v
    c[..., offset:offset + dk] = case.k
    scale = case.scale if case.scale is not None else 1.0 / np.sqrt(dk)
    return Latent(q, c, int(offset), float(scale))
