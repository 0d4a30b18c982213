"""Dropout on the attention weights (ATTN-DROP-1, ATTN-DROP-2).

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
below alpha = 1e-6.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import math

import numpy as np

from attnconf import spec
from attnconf.conformance import strategies as st
from attnconf.conformance.harness import clauses, expect, expect_close, expect_equivalent, first, for_cases, run
from attnconf.conformance.tolerance import ulp
from attnconf.reference import oracle



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


@first(3)
@clauses("ATTN-DROP-2")
@for_cases(st.dropout_cases(), weight=0.12, dtypes=("float64", "float32"))
def test_dropout_statistics(impl, case):
    """Kept entries equal P / (1 - p); the keep rate is 1 - p and the mean over N calls is the
    no-dropout output, each within a Hoeffding bound at alpha / 3."""
    p = case.dropout_p
    plain = case.replace(dropout_p=0.0)
    r0 = run(impl, plain)
    if r0 is None:
        return
    j0 = expect_close(r0.out, plain, impl, clause="ATTN-DROP-1")
    w = oracle(plain).out                       # = the weights P, because V is the identity
    a = j0.allowed_max
    vis = w > 0
    alpha = spec.tolerances()["statistics"]["alpha"]
    n_calls = min(400, calls_needed(p, int(vis.sum()), alpha))
    outs = []
    for k in range(n_calls):
        res = run(impl, case.replace(seed=(case.seed * 7919 + k + 1) % 2**31))
        if res is None:
            return
        outs.append(res.out)
    outs = np.stack(outs)                                             # (N, B, H, Lq, Lk)
    kept_value = w / (1 - p)
    room = a / (1 - p) + 2 * ulp(kept_value, case.dtype)
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
