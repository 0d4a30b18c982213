"""Attention sinks (ATTN-SINK-1..4): a per-head logit in every row's denominator, with no value.

A sink only rescales rows: with (O0, lse0) the sink-free result, O = O0 / (1 + exp(sink - lse0)) and
lse = log(exp(lse0) + exp(sink)). That law is checked between a kernel's own runs with and without the
sink, so a sink counted as a key with a value (an extra V row), a sink left out of the lse, a sink
scaled by the softmax scale or capped, or a sink applied once per KV head instead of per query head
all fail it; a sink far below the row's lse must change nothing; a row with no visible key outputs 0
and its lse is the sink.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf import spec
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import (clauses, expect, expect_close, expect_equivalent, for_cases, judge,
                                          lse_need, run)
from attnconf.conformance.engine.tolerance import EPS64, judge_arrays, judge_gradients, judge_lse
from attnconf.reference import backward, expand_kv, oracle, sink_factor
from attnconf.reference.attention import alibi_bias


@clauses("ATTN-SINK-1", "ATTN-SINK-2")
@for_cases(st.sink_cases(), weight=0.6,
           examples=[st.fixed_case(91, B=2, Hq=4, Hkv=2, Lq=9, Lk=13, Dk=16, sinks=np.array([0.5, 3.0, -2.0, 8.0])),
                     st.fixed_case(92, Lq=9, Lk=4, Dk=8, dtype="bfloat16", causal="bottom_right",
                                   sinks=np.array([1.0, -1.0]))], needs=("sinks",))
def test_sinks_match_reference(impl, case):
    """Cases with sinks (small, comparable and dominant, with windows and empty rows) agree with the reference,
    and so does their lse (sink included) where the kernel returns one."""
    res = run(impl, case, need=lse_need(impl, case))
    expect_close(res.out, case, impl, clause="ATTN-SINK-1")
    if res.lse is not None:
        judge(judge_lse(res.lse, case), case, impl, "ATTN-SINK-2")


@clauses("ATTN-SINK-2", "ATTN-LSE-4", "ATTN-SINK-5")
@for_cases(st.sink_cases(max_len=33), weight=0.5, needs=("sinks",))
def test_a_sink_scales_each_row(impl, case):
    """O_sink = O_nosink / (1 + exp(sink - lse_nosink)) row by row, between the kernel's two runs, within the
    two runs' allowances (the factor, computed from the reference lse, is in (0, 1]); and lse_sink =
    logaddexp(lse_nosink, sink) where the kernel returns lse."""
    plain = case.replace(sinks=None)
    need = lse_need(impl, case)
    r1, r0 = run(impl, case, need=need), run(impl, plain, need=need)
    j1 = expect_close(r1.out, case, impl, clause="ATTN-SINK-2")
    j0 = expect_close(r0.out, plain, impl, clause="ATTN-SINK-2")
    f = sink_factor(oracle(plain).lse, case.sinks[None, :, None])[..., None]           # (B, Hq, Lq, 1)
    gap = float(np.abs(oracle(case).out - f * oracle(plain).out).max(initial=0.0))
    d = np.abs(r1.out - f * r0.out)
    allowed = j1.allowed_max + f * j0.allowed_max + gap
    bad = np.argwhere(d > allowed)
    if bad.size:
        i = tuple(int(x) for x in bad[0])
        expect(False, "ATTN-SINK-2", f"with the sink, output {r1.out[i]:.6g} at {i} is not the sink-free output "
               f"{r0.out[i]:.6g} times 1/(1 + exp(sink - lse)) = {f[i[:3]][0]:.6g} (difference {d[i]:.3g} > "
               f"{allowed[i] if np.ndim(allowed) else allowed:.3g})", case, impl)
    if r1.lse is None or r0.lse is None:
        return
    l1 = judge(judge_lse(r1.lse, case), case, impl, "ATTN-SINK-2")
    l0 = judge(judge_lse(r0.lse, plain), plain, impl, "ATTN-SINK-2")
    with np.errstate(invalid="ignore"):
        want = np.logaddexp(r0.lse, case.sinks[None, :, None])
    dl = float(np.abs(r1.lse - want).max(initial=0.0))
    expect(dl <= l1.allowed_max + l0.allowed_max + 1e-12 * max(1.0, float(np.abs(want).max(initial=0.0))),
           "ATTN-SINK-2", f"lse with the sink differs from logaddexp(lse without it, sink) by {dl:.3g}", case, impl)


@clauses("ATTN-SINK-2")
@for_cases(st.cases(max_len=65), weight=0.3, needs=("sinks",))
def test_a_very_negative_sink_changes_nothing(impl, case):
    """A sink 100 below every row's lse (exp(-100) ~ 4e-44 of the denominator) gives the sink-free output."""
    lse = oracle(case).lse
    low = float(np.min(lse[np.isfinite(lse)], initial=0.0)) - 100.0
    if case.dtype == "float16":
        low = max(low, -6e4)
    expect_equivalent(impl, case, case.replace(sinks=np.full(case.shape["Hq"], low)), clause="ATTN-SINK-2",
                      what=f"sink {low:.4g} vs no sink")


@clauses("ATTN-SINK-3", "ATTN-LSE-2", "ATTN-EMPTY-1")
@for_cases(st.window_empty_row_cases(sinks=True), weight=0.4, needs=("sinks",))
def test_rows_without_keys_output_zero_and_their_lse_is_the_sink(impl, case):
    """A row the window leaves without a key outputs exactly 0 with a sink too; its lse is the sink, not -inf."""
    empty = ~oracle(case).visible.any(axis=-1)
    assert empty.any()
    res = run(impl, case, need=lse_need(impl, case))
    bad = np.argwhere(empty & ~(res.out == 0).all(axis=-1))
    expect(bad.size == 0, "ATTN-SINK-3", f"{len(bad)} rows with no key but a sink are not exactly 0", case, impl)
    if res.lse is not None:
        sink = np.broadcast_to(case.sinks[None, :, None], empty.shape)
        wrong = np.argwhere(empty & ~np.isfinite(res.lse))
        expect(wrong.size == 0, "ATTN-SINK-3", f"lse of a row with no key is {res.lse[tuple(wrong[0])] if wrong.size else ''}; "
               f"with a sink it is the sink ({sink[tuple(wrong[0])] if wrong.size else ''})", case, impl)
        judge(judge_lse(res.lse, case), case, impl, "ATTN-SINK-3")
    expect_close(res.out, case, impl, clause="ATTN-SINK-3")


def _dsinks_magnitude(case) -> np.ndarray:
    """|dsink|_abs: sum over (b, i) of P_sink * sum_d |dO O|, the magnitude the gradient is summed from."""
    f = oracle(case)
    p_sink = np.exp(case.sinks[None, :, None] - f.lse)
    return (p_sink * np.abs(case.grad_out * f.out).sum(axis=-1)).sum(axis=(0, 2))


def _dsinks_bound64(case) -> np.ndarray:
    """The float64 bound for dsink, by the first-order argument of ATTN-TOL-4/-5: each row's O is off by at most
    eps64 Vmax_i K (with K = (Dk + 6) A + 2 (Lk + 1) + 4: the softcap's four roundings, the sink's term) and
    its lse, hence P_sink, by eps64 K relative; D = sum_d dO O and the sum over B * Lq rows add their own."""
    f = oracle(case)
    s = case.shape
    hq = s["Hq"]
    k = expand_kv(case.k, hq)
    logit = abs(case.effective_scale) * np.einsum("bhid,bhjd->bhij", np.abs(case.q), np.abs(k))
    if case.bias is not None:
        logit = logit + np.abs(np.where(np.isneginf(case.bias), 0.0, case.bias))
    if case.alibi_slopes is not None:
        logit = logit + np.abs(alibi_bias(logit.shape, case.alibi_slopes, case.window_align, case.q_lengths,
                                          case.kv_lengths))
    a = max(float(np.where(f.visible, logit, 0.0).max(initial=0.0)), float(np.abs(case.sinks).max()))
    vmax = np.where(f.visible, np.abs(expand_kv(case.v, hq)).max(axis=-1)[:, :, None, :], 0.0).max(axis=-1, initial=0.0)
    kk = (s["Dk"] + 6) * a + 2 * (s["Lk"] + 1) + 4 + s["Dv"] + s["B"] * s["Lq"]
    p_sink = np.exp(case.sinks[None, :, None] - f.lse)
    mag = (p_sink * (np.abs(case.grad_out).sum(axis=-1) * vmax + np.abs(case.grad_out * f.out).sum(axis=-1)))
    gamma = spec.tolerances()["float64"]["gamma"]
    return gamma * EPS64 * kk * mag.sum(axis=(0, 2))


@clauses("ATTN-SINK-4", "ATTN-GRAD-1", "ATTN-TOL-5")
@for_cases(st.sink_cases(grad=True, max_len=33), weight=0.4, needs=("sinks", "grads"))
def test_sink_gradients(impl, case):
    """dQ, dK, dV with sinks agree with the float64 backward; where the kernel returns the sink's own gradient,
    dsink = -sum exp(sink - lse) rowsum(dO O) agrees too (gradient model; float64: the analytic bound of
    ATTN-TOL-5 over the B * Lq terms it sums)."""
    res = run(impl, case, grads=True)
    for j in judge_gradients(res.grads, case):
        judge(j, case, impl)
    got = (res.grads or {}).get("dsinks")
    if got is None:
        return
    ref = backward(case).dsinks
    expect(np.shape(got) == ref.shape, "ATTN-SINK-4", f"dsinks shape {np.shape(got)} != {ref.shape}", case, impl)
    mag = _dsinks_magnitude(case)
    if case.dtype == "float64":
        bound = _dsinks_bound64(case)
        err = np.abs(got - ref)
        expect(bool((err <= bound).all()), "ATTN-SINK-4", f"dsinks error {err.max():.3g} exceeds the float64 bound "
               f"{bound[np.argmax(err)]:.3g}", case, impl)
        return
    from attnconf.reference.emulate_backward import gradient_baseline_error

    judge(judge_arrays(got, ref, gradient_baseline_error(case)["dsinks"], case.dtype, quantity="dsinks",
                       model="gradient", magnitude=mag), case, impl, "ATTN-SINK-4")
