"""Alternatives (`instead`) for adapters/tinygrad/divergences.toml that the README's vocabulary lacks.

Each function takes a Case and returns the expected values per quantity, as float64 arrays of the
quantity's shape. Convention: a NaN in an expected array means "this element must be NaN"; a finite
value is judged against the actual one by the normal tolerance model (it is the reference value).

Measured with tinygrad 0.14.0, CPU device, clang renderer (Debian clang 14.0.6).
"""
from __future__ import annotations

import numpy as np

from attnconf.reference import Case
from attnconf.reference.backward import backward, reduce_to_shape

from attnconf.adapters.tinygrad.regions import nan_rows


def nan_rows_poison_gradients(case: Case) -> dict[str, np.ndarray]:
    """Gradients when some rows of P are NaN (fully-masked rows, float16 logits that overflow).

    tinygrad back-propagates through its plain softmax, so a NaN row i of P (batch b, query head h)
    gives: dQ[b, h, i, :] = NaN; dBias NaN over the whole row i (every key, masked ones included:
    dS = P * (dP - D) is NaN there), summed over the bias's broadcast axes like dBias itself;
    and, through dV = P^T dO and dK = s dS^T Q, NaN in every row of dK and dV of key/value head
    g(h) = h // (Hq / Hkv) of batch b. Every other element is the reference gradient.

    Measured (tinygrad 0.14.0, float32, B=2 Hq=4 Hkv=2 Lq=5 Lk=6, row (1, 2, 3) masked): dq NaN only
    in that row (8 of 320 elements), dk and dv NaN in exactly the 48 elements of head (1, 1), dbias
    (1, 4, 5, 6) NaN in the 6 elements of row (0, 2, 3); all other elements finite.
    """
    ref = backward(case)
    bad = nan_rows(case)                                        # (B, Hq, Lq)
    s = case.shape
    group = s["Hq"] // s["Hkv"]
    dq = np.where(bad[..., None], np.nan, ref.dq)
    heads = bad.any(axis=-1).reshape(s["B"], s["Hkv"], group).any(axis=-1)   # (B, Hkv)
    dk = np.where(heads[:, :, None, None], np.nan, ref.dk)
    dv = np.where(heads[:, :, None, None], np.nan, ref.dv)
    out = {"dq": dq, "dk": dk, "dv": dv}
    if case.bias is not None and ref.dbias is not None:
        full = np.broadcast_to(bad[..., None], (s["B"], s["Hq"], s["Lq"], s["Lk"])).astype(np.float64)
        poisoned = reduce_to_shape(full, case.bias.shape) > 0
        out["dbias"] = np.where(poisoned, np.nan, ref.dbias)
    return out


def nan_rows_output(case: Case) -> dict[str, np.ndarray]:
    """The forward output with tinygrad's NaN rows (the README's `nan` alternative, restricted to
    `nan_rows`): NaN on those rows, the reference elsewhere. Provided for completeness; the
    forward entries use the vocabulary's `nan` with a row region."""
    from attnconf.reference import oracle  # noqa: PLC0415

    return {"out": np.where(nan_rows(case)[..., None], np.nan, oracle(case).out)}


def single_key_weight_one(case: Case) -> dict[str, np.ndarray]:
    """Forward and gradients when the only key (Lk = 1) of a row is hidden: tinygrad's softmax over an
    axis of one element is 1 whatever the logit (-inf included), so the row outputs V of that key,
    its dQ is 0, it adds nothing to dK (dS = P (dP - rowsum) = 0) and adds its dO to dV; dBias of
    the row is 0. Measured (float64, Lq = 2, Lk = 1, hidden by mask, -inf bias, bottom-right causal
    and kv_len 0 alike): out rows equal V, dq = 0, dk = 0, dv = the sum of dO over the rows."""
    from attnconf.reference import expand_kv, oracle  # noqa: PLC0415
    from attnconf.reference.backward import group_sum  # noqa: PLC0415

    from attnconf.adapters.tinygrad.regions import single_key_empty_rows  # noqa: PLC0415

    rows = np.asarray(single_key_empty_rows(case), dtype=bool)
    s = case.shape
    ve = expand_kv(case.v, s["Hq"])                                  # (B, Hq, 1, Dv)
    out = np.where(rows[..., None], ve, oracle(case).out)
    expected = {"out": out}
    if case.grad_out is not None:
        ref = backward(case)
        w = rows[..., None].astype(np.float64)                          # (B, Hq, Lq, 1)
        extra = group_sum(np.swapaxes(w, -1, -2) @ case.grad_out, s["Hkv"])
        expected.update({"dq": np.where(rows[..., None], 0.0, ref.dq), "dk": ref.dk, "dv": ref.dv + extra})
        if case.bias is not None and ref.dbias is not None:
            expected["dbias"] = ref.dbias
    return expected


# expected-value alternatives registered by alternatives.load_all
ALTERNATIVES = {"single_key_weight_one": single_key_weight_one}
