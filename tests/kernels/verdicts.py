"""Kernels for the verdict machinery's own tests (tests/test_verdicts.py).

Each is the float64 reference (as `numpy:reference` computes it) with one behaviour changed, written
as an `Adapter` so it sees the whole Case (mask and bias apart) and can be given to the suite with
`--backend=numpy --kernel=tests.kernels.verdicts:NAME`.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.base import Result
from attnconf.adapters.numpy import ReferenceAdapter
from attnconf.conformance.engine.alternatives import uniform_weights
from attnconf.conformance.engine.regions import mask_emptied_rows
from attnconf.reference import Case, expand_kv, round_to
from attnconf.spec.vocabulary import HALF_DTYPES


def _mean_rows(case: Case, out: np.ndarray) -> np.ndarray:
    """`out` with every row emptied by the mask (not by -inf bias alone) replaced by the uniform mean
    of V over the keys the mask hides: what an API that masks with a large finite negative returns."""
    rows = mask_emptied_rows(case)
    w = uniform_weights(case, rows)
    mean = np.einsum("bhij,bhjd->bhid", w, expand_kv(case.v, case.shape["Hq"]))
    return np.where(rows[..., None], mean, out)


class MeanOfValues(ReferenceAdapter):
    """Correct, except that mask-emptied rows output the mean of V (a documented divergence can say so)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        res = super().run(case, grads=grads)
        res.out = round_to(_mean_rows(case, res.out), case.dtype)
        return res


class MeanOfValuesTripledLogits(ReferenceAdapter):
    """MeanOfValues, and in every case that has a mask-emptied row every other row is computed with
    its logits tripled: a bug that a divergence covering whole cases would hide."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if mask_emptied_rows(case).any():
            case = case.replace(scale=3.0 * case.effective_scale, grad_out=case.grad_out)
        res = super().run(case, grads=grads)
        res.out = round_to(_mean_rows(case, res.out), case.dtype)
        return res


class HalfOnlyWrong(ReferenceAdapter):
    """Correct in float64, float32 and bfloat16; in float16 the scale is off by 10 % (one dtype cell fails)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if case.dtype == "float16":
            case = case.replace(scale=1.1 * case.effective_scale)
        return super().run(case, grads=grads)


class WrongOutputDtype(ReferenceAdapter):
    """Correct values, but half-precision inputs give a float32 output (breaks ATTN-OP-5 and nothing else)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        res = super().run(case, grads=grads)
        if case.dtype in HALF_DTYPES:
            res.out_dtype = "float32"
        return res


class RaisesOnMultiQuery(ReferenceAdapter):
    """Correct, except that one KV head shared by several query heads raises (as Keras on TensorFlow does)."""

    def run(self, case: Case, *, grads: bool = False) -> Result:
        if case.shape["Hkv"] == 1 and case.shape["Hq"] > 1:
            raise ValueError("Expected dimension 4 at axis 2 but got dimension 1")
        return super().run(case, grads=grads)
