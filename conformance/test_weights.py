"""Attention weights are distributions, exactly 0 where a key is invisible (ATTN-W-1, -2, PROP-3, -5).

Most kernels never return their weights, so the suite reads them through the
output (SPEC.md section 8): with V = ones the output is the row sum of P, and
with V = one-hot columns of the identity the output *is* P, a block of Dv
columns per call (Dv = Dk where the kernel needs it). The recovered P is then
exact where the spec is exact: an invisible key's weight is an exact 0 and
multiplies an exact 0 or 1, so its column reads back as exactly 0 (ATTN-W-2,
ATTN-PROP-3), and a convex combination of 0/1 values cannot be negative
(ATTN-W-1). Row sums and the weights' values are judged with the tolerance
model of the V = ones and one-hot cases; the entropy bound of ATTN-PROP-5 gets
exactly the slack that the model's per-entry allowance implies
(|H(p) - H(p')| <= sum_j phi(|p_j - p'_j|), phi(t) = -t log t).

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters import Adapter
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, for_cases, run
from attnconf.reference import Case, causal_visible, oracle

PINNED = [
    st.fixed_case(11, Lq=5, Lk=7, Dk=8, causal="top_left"),
    st.fixed_case(12, B=2, Hq=4, Hkv=2, Lq=9, Lk=4, Dk=4, causal="bottom_right", dtype="float16"),
    st.fixed_case(13, Lq=4, Lk=9, Dk=4, causal="bottom_right", dtype="bfloat16"),
    st.fixed_case(14, B=2, Lq=6, Lk=17, Dk=8, dtype="float64", kv_lengths=[5, 0], causal="top_left"),
    st.fixed_case(15, Lq=3, Lk=33, Dk=16, mask=np.tile(np.arange(33) % 3 != 0, (3, 1)), regime="large"),
]


def onehot_v(case: Case, start: int, width: int) -> np.ndarray:
    """V whose column c is the indicator of key start + c (columns past Lk are 0)."""
    s = case.shape
    block = np.zeros((s["Lk"], width))
    n = min(width, s["Lk"] - start)
    block[start:start + n, :n] = np.eye(n)
    return np.broadcast_to(block, (s["B"], s["Hkv"], s["Lk"], width)).copy()


def recover_weights(impl: Adapter, case: Case) -> tuple[np.ndarray, list[tuple[np.ndarray, Case]]]:
    """P (B, Hq, Lq, Lk) read through one-hot V, and the (output, case) of each call for judging.

    Blocks of Dv = Dk columns keep the case's shapes: no dv_ne_dk capability needed, and kernels that
    compile per shape (XLA, flex) compile once for the V = ones run and all blocks.
    """
    s = case.shape
    blocks = [(j, case.replace(v=onehot_v(case, j, s["Dk"]))) for j in range(0, s["Lk"], s["Dk"])]
    w = np.zeros((s["B"], s["Hq"], s["Lq"], s["Lk"]))
    runs = []
    for j, block in blocks:
        res = run(impl, block)
        runs.append((res.out, block))
        n = min(block.shape["Dv"], s["Lk"] - j)
        w[..., j:j + n] = res.out[..., :n]
    return w, runs


def phi(t: float) -> float:
    """A modulus of continuity of x -> -x log x on [0, 1]."""
    return 1 / np.e if t > 1 / np.e else (0.0 if t <= 0 else float(-t * np.log(t)))


def weight_sign_problem(w: np.ndarray) -> str:
    """Why `w >= 0` fails: NaN weights are named as NaN (they are not negative), else the most negative one."""
    nan = np.isnan(w)
    if nan.any():
        return (f"{int(nan.sum())} weight(s) are NaN, first at {tuple(int(i) for i in np.argwhere(nan)[0])} "
                f"(a weight is a probability: finite and >= 0)")
    return f"negative weight {w.min():.3g} at {tuple(int(i) for i in np.unravel_index(np.argmin(w), w.shape))}"


def check_exact(w: np.ndarray, case: Case, impl: Adapter) -> None:
    """Non-negative everywhere; exactly 0 on invisible keys (and above the aligned causal diagonal)."""
    expect(bool((w >= 0).all()), "ATTN-W-1", weight_sign_problem(w), case, impl)
    hidden = ~oracle(case).visible
    leak = hidden & (w != 0)
    expect(not leak.any(), "ATTN-W-2", f"{int(leak.sum())} invisible key(s) with nonzero weight, first at "
           f"{tuple(int(i) for i in np.argwhere(leak)[0]) if leak.any() else None}: "
           f"{w[leak][0] if leak.any() else 0:.3g}", case, impl)
    if case.causal is not None:
        s = case.shape
        for b in range(s["B"]):
            ql = None if case.q_lengths is None else int(case.q_lengths[b])
            kl = None if case.kv_lengths is None else int(case.kv_lengths[b])
            above = ~causal_visible(s["Lq"], s["Lk"], case.causal, ql, kl)
            bad = above[None] & (w[b] != 0)
            expect(not bad.any(), "ATTN-PROP-3", f"batch {b}: nonzero weight above the {case.causal} diagonal at "
                   f"(head, i, j) = {tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None}",
                   case, impl)


def check_entropy(w: np.ndarray, eta: float, case: Case, impl: Adapter) -> None:
    """0 - slack <= H(row) <= log(#visible) + slack, slack = #visible * phi(eta); with sinks, of the row
    renormalised over its keys (the sink's share taken out)."""
    n = oracle(case).visible.sum(axis=-1)
    if case.sinks is not None:
        total = w.sum(axis=-1, keepdims=True)
        w = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
    pos = np.where(w > 0, w, 1.0)
    h = -(np.where(w > 0, w * np.log(pos), 0.0)).sum(axis=-1)
    rows = n > 0
    slack = n * phi(eta)
    hi = np.log(np.maximum(n, 1)) + slack
    bad = rows & ((h > hi) | (h < -slack))
    if bad.any():
        r = tuple(int(i) for i in np.argwhere(bad)[0])
        expect(False, "ATTN-PROP-5", f"row {r}: entropy {h[r]:.6g} outside [0, log {int(n[r])} = "
               f"{np.log(n[r]):.6g}] by more than the slack {slack[r]:.3g}", case, impl)


@clauses("ATTN-W-1", "ATTN-W-2", "ATTN-PROP-3", "ATTN-PROP-5", "ATTN-EMPTY-1")
@for_cases(st.onehot_cases(sinks=True), examples=PINNED, weight=0.5)
def test_weights_through_output(impl, case):
    """V = ones gives the row sums; one-hot V gives P: a distribution, exactly 0 where invisible."""
    ones = case.replace(v=np.ones_like(case.v))
    res = run(impl, ones)
    w, runs = recover_weights(impl, case)
    check_exact(w, case, impl)
    expect_close(res.out, ones, impl, clause="ATTN-W-1")
    eta = max(expect_close(out, block, impl, clause="ATTN-W-1").allowed_max for out, block in runs)
    check_entropy(w, eta, case, impl)


@clauses("ATTN-W-1", "ATTN-W-2", "ATTN-PROP-3", "ATTN-PROP-5", "ATTN-EMPTY-2")
@for_cases(st.onehot_cases(sinks=True), examples=PINNED, weight=0.5, needs=("weights",))
def test_returned_weights(impl, case):
    """Where the kernel returns P, it is the reference's: row sums 1, exact zeros, entropy in bounds."""
    res = run(impl, case, need={"weights"})
    s = case.shape
    want = (s["B"], s["Hq"], s["Lq"], s["Lk"])
    expect(res.weights is not None and res.weights.shape == want, "ATTN-W-1",
           f"weights shape {None if res.weights is None else res.weights.shape} != {want}", case, impl)
    w = res.weights
    check_exact(w, case, impl)
    ones = case.replace(v=np.ones_like(case.v))
    expect_close(np.broadcast_to(w.sum(axis=-1, keepdims=True), ones.out_shape), ones, impl, clause="ATTN-W-1")
    as_output = case.replace(v=onehot_v(case, 0, s["Lk"]))
    eta = expect_close(w, as_output, impl, clause="ATTN-W-1").allowed_max
    check_entropy(w, eta, case, impl)
