"""Dropout on the attention weights (ATTN-DROP-1, ATTN-DROP-2, ATTN-DROP-3).

Random streams differ between frameworks, so dropout is never compared element
by element; it is checked through the public API with V = the one-hot rows of
the identity (Dv = Lk), where output entry (i, j) *is* the dropped-out weight
P[i, j] * keep / (1 - p). Three checks, each catching a real defect:

- every entry is 0 or P[i, j] / (1 - p) within the output tolerance (a kernel that
  forgets the 1/(1-p) rescale fails deterministically);
- the fraction of kept entries over N calls is binomial with rate 1 - p (a kernel that
  ignores dropout_p keeps everything);
- the mean over N calls of each entry, and of the sum of all entries, is the
  no-dropout output (the expectation clause).

The two statistical checks use Hoeffding's inequality, which holds for any
bounded independent samples at every N (no normal approximation): with
alpha = [statistics] alpha split in three (binomial, pooled sum, and the entries
with Bonferroni over them), a correct kernel fails an example with probability
below alpha = 1e-6. They run in every dtype, with p in {0.1, 0.3, 0.7}: never
0.5, where a kernel rescaling by 1/p instead of 1/(1-p) would be right.

Two more checks read the keep mask off the same one-hot output:

- independence: with Q = K = 0 every kept entry is 1/(L (1 - p)), and two entries
  that differ only in the batch element, the head, the query row or the key are
  kept or dropped alike with probability p^2 + (1-p)^2 (a mask shared across heads
  agrees always); Hoeffding again, alpha split over the four axes;
- gradients: the output of a call with gradients is the dropped-out weight matrix W
  itself, so the same call's dV must be W^T dO (summed over each key/value group):
  a backward that does not replay the forward's mask is far off.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import math

import numpy as np

from attnconf import spec
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, expect_equivalent, first, for_cases, judge, run
from attnconf.conformance.engine.tolerance import judge_gradients, ulp
from attnconf.reference import oracle
from attnconf.reference.backward import group_sum



@clauses("ATTN-DROP-1")
@for_cases(st.cases(max_len=65), weight=0.2)
def test_zero_dropout_is_deterministic(impl, case):
    """With dropout_p = 0 two runs with different seeds agree with the reference and with each other
    (within the sum of their allowances: bitwise equality is ATTN-OP-7's record, not a requirement)."""
    other = case.replace(seed=(case.seed + 1) % 2**32)
    expect_equivalent(impl, case, other, clause="ATTN-DROP-1", what="two p = 0 runs")


def calls_needed(p: float, entries: int, alpha: float) -> int:
    """N such that a kernel ignoring dropout (keep rate 1, not 1 - p) is at least twice the binomial
    test's Hoeffding threshold away: p >= 2 sqrt(log(6 / alpha) / (2 N entries))."""
    return max(32, math.ceil(2 * math.log(6 / alpha) / (p * p * entries)))


def draw_k(case, k: int):
    """The case with the k-th of its independent dropout seeds."""
    return case.replace(seed=(case.seed * 7919 + k + 1) % 2**31)


def kept_room(w: np.ndarray, allowed: float, p: float, dtype: str) -> np.ndarray:
    """How far a kept entry may lie from w / (1 - p): the weight's own error (the no-dropout run's allowance
    `allowed`, scaled by 1/(1-p)), plus two roundings to the dtype: of the factor 1/(1-p) (or 1 - p) and of
    the rescaled weight. Each costs at most u |x| < ulp(x) (u = 2**-(mantissa bits + 1), the unit roundoff)."""
    return allowed / (1 - p) + 2 * ulp(w / (1 - p), dtype)


@first(3)
@clauses("ATTN-DROP-2")
@for_cases(st.dropout_cases(), weight=0.12, needs=("dropout",))
def test_dropout_statistics(impl, case):
    """Kept entries equal P / (1 - p); the keep rate is 1 - p and the mean over N calls is the
    no-dropout output, each within a Hoeffding bound at alpha / 3."""
    p = case.dropout_p
    first_draw = run(impl, draw_k(case, 0))     # first: a kernel that refuses dropout has nothing to pass here
    plain = case.replace(dropout_p=0.0)
    r0 = run(impl, plain)
    j0 = expect_close(r0.out, plain, impl, clause="ATTN-DROP-1")
    w = oracle(plain).out                       # = the weights P, because V is the identity
    a = j0.allowed_max
    vis = w > 0
    alpha = spec.tolerances()["statistics"]["alpha"]
    n_calls = min(400, calls_needed(p, int(vis.sum()), alpha))
    outs = [first_draw.out]
    for k in range(1, n_calls):
        res = run(impl, draw_k(case, k))
        outs.append(res.out)
    outs = np.stack(outs)                                             # (N, B, H, Lq, Lk)
    kept_value = w / (1 - p)
    room = kept_room(w, a, p, case.dtype)
    kept = outs != 0
    off = np.abs(outs - kept_value) > room
    bad = np.argwhere(kept & off)
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        expect(False, "ATTN-DROP-2", f"{len(bad)} kept entries are not P/(1-p): first at call {i[0]}, entry {i[1:]}: "
               f"{outs[i]:.6g} vs P/(1-p) = {kept_value[i[1:]]:.6g} (P = {w[i[1:]]:.6g}, p = {p:g})", case, impl)
    # the keep rate: a Binomial(M, 1 - p) count of nonzero entries at visible positions
    m = n_calls * int(vis.sum())
    rate = float(kept[:, vis].sum()) / m
    t_rate = math.sqrt(math.log(6 / alpha) / (2 * m))
    expect(abs(rate - (1 - p)) <= t_rate, "ATTN-DROP-2",
           f"keep rate {rate:.4f} over {m} weights, expected {1 - p:g} +- {t_rate:.4f} (Hoeffding, alpha/3)", case, impl)
    # the expectation: every sample of entry e lies in [0, w_e / (1 - p) + room_e], and its mean is
    # (1 - p) times a kept value within room_e of w_e / (1 - p): at most (1 - p) room_e from w_e
    hi = kept_value + room
    bias = (1 - p) * room
    mean = outs.mean(axis=0)
    n_e = int(vis.sum())
    t_e = hi * math.sqrt(math.log(6 * n_e / alpha) / (2 * n_calls)) + bias
    bad = np.argwhere(vis & (np.abs(mean - w) > t_e))
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        expect(False, "ATTN-DROP-2", f"mean over {n_calls} calls of entry {i} is {mean[i]:.6g}, the no-dropout "
               f"output is {w[i]:.6g} (allowed +- {t_e[i]:.3g}, Hoeffding with Bonferroni over {n_e} entries)",
               case, impl)
    total = float(outs.sum()) / n_calls
    t_sum = (math.sqrt(math.log(6 / alpha) / 2 * n_calls * float((hi[vis] ** 2).sum())) / n_calls
             + float(bias[vis].sum()))
    expect(abs(total - float(w.sum())) <= t_sum, "ATTN-DROP-2",
           f"mean total weight per call {total:.6g}, expected {float(w.sum()):.6g} +- {t_sum:.3g} "
           f"(no-dropout sum; Hoeffding, alpha/3)", case, impl)


# the axes of the (N, B, H, Lq, Lk) keep masks along which neighbours are paired
AXES = {"batch element": 1, "head": 2, "query row": 3, "key": 4}


@clauses("ATTN-DROP-2")
@for_cases(st.dropout_cooccurrence_cases(), weight=0.12, needs=("dropout",))
def test_dropout_masks_are_independent(impl, case):
    """Each weight is kept independently: along each axis (batch element, head, query row, key), the
    disjoint neighbour pairs (0, 1), (2, 3), ... are both kept or both dropped at the rate p^2 + (1-p)^2
    of independent draws, within a Hoeffding bound at alpha / 4 over the M pairs of N calls."""
    p = case.dropout_p
    alpha = spec.tolerances()["statistics"]["alpha"]
    rate = p * p + (1 - p) * (1 - p)
    pairs = int(np.prod(case.out_shape)) // 2          # per call and axis: every extent is even
    # a mask shared along an axis agrees always, 1 - rate = 2 p (1 - p) above the rate: enough calls that
    # this is at least twice the two-sided threshold t = sqrt(log(8 / alpha) / (2 M))
    n_calls = max(2, math.ceil(math.log(8 / alpha) / (2 * (p * (1 - p)) ** 2 * pairs)))
    kept = []
    for k in range(n_calls):
        res = run(impl, draw_k(case, k))
        kept.append(res.out != 0)                      # Q = K = 0: a kept entry is 1/(L (1 - p)) > 0
    kept = np.stack(kept)
    m = n_calls * pairs
    t = math.sqrt(math.log(8 / alpha) / (2 * m))
    for name, axis in AXES.items():
        n = kept.shape[axis]
        agree = float((np.take(kept, np.arange(0, n, 2), axis=axis)
                       == np.take(kept, np.arange(1, n, 2), axis=axis)).mean())
        expect(abs(agree - rate) <= t, "ATTN-DROP-2",
               f"the keep masks of neighbouring {name}s agree on {agree:.4f} of {m} pairs; independent draws "
               f"agree at p^2 + (1-p)^2 = {rate:.4f} +- {t:.4f} (Hoeffding, alpha/4; p = {p:g})", case, impl)


@clauses("ATTN-DROP-3", "ATTN-GRAD-1")
@for_cases(st.dropout_grad_cases(), weight=0.12, needs=("grads", "dropout"))
def test_dropout_gradients_replay_the_forward_mask(impl, case):
    """With one-hot V the output of a call is its dropped-out weight matrix W, so the gradients it returns
    are those of sum(dO * W V): dV = W^T dO, summed over each key/value head's group. Allowed: the
    no-dropout dV allowance scaled by 1/(1-p) (each term is the same product, scaled by 0 or 1/(1-p)),
    plus sum_i 2 room[i, j] |dO[i]|, since the backward's W and the returned one each lie within
    `kept_room` of the exact dropped-out weights."""
    p = case.dropout_p
    res = run(impl, case, grads=True)           # first: a kernel refusing dropout leaves the example unsupported
    expect(res.grads is not None and "dv" in res.grads, "ATTN-DROP-3",
           f"gradients missing under dropout: got {sorted(res.grads or {})}", case, impl)
    plain = case.replace(dropout_p=0.0)
    r0 = run(impl, plain, grads=True)
    a = expect_close(r0.out, plain, impl, clause="ATTN-DROP-1").allowed_max
    expect(r0.grads is not None and "dv" in r0.grads, "ATTN-GRAD-1",
           f"gradients missing: got {sorted(r0.grads or {})}", plain, impl)
    allowed_plain = [judge(j, plain, impl) for j in judge_gradients(r0.grads, plain) if j.quantity == "dv"][0]
    hkv, do = case.shape["Hkv"], case.grad_out
    out = res.out                                      # (B, Hq, Lq, Lk): W itself
    room = np.where(out != 0, kept_room(oracle(plain).out, a, p, case.dtype), 0.0)
    expected = group_sum(np.swapaxes(out, -1, -2) @ do, hkv)
    allowed = allowed_plain.allowed_max / (1 - p) + group_sum(np.swapaxes(2 * room, -1, -2) @ np.abs(do), hkv)
    dv = np.broadcast_to(res.grads["dv"], expected.shape)
    err = np.abs(dv - expected)
    bad = np.argwhere(~(err <= allowed))               # NaN is bad too
    if bad.size:
        i = tuple(int(x) for x in bad[0])
        expect(False, "ATTN-DROP-3", f"dV is not O^T dO (the forward's dropped-out weights) at {len(bad)} of "
               f"{err.size} entries: first at {i}: {dv[i]:.6g} vs {expected[i]:.6g} (allowed +- {allowed[i]:.3g}; "
               f"p = {p:g}): the backward does not use the keep mask of its own forward", case, impl)
