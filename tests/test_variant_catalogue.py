"""The variant bug catalogue (tests/kernels/variant_bugs.py): each defect is real, and the suite catches it.

Fast layer: the control equals the reference; each buggy kernel differs from the reference on a witness
case built for its defect, in the quantity the defect touches (output, lse or dQ), so a bug the suite
misses is the suite's gap, not a dud bug. Also: `--kernel` accepts a ready-made Adapter (class or
instance) for any backend and marks it untrusted.

Slow layer: `pytest conformance --backend=numpy --kernel=tests.kernels.variant_bugs:NAME -x` in a
subprocess for each kernel: every bug must end NONCONFORMANT and the control CONFORMANT.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnconf import adapters
from attnconf.reference import Case, backward, oracle
from bench.runner import run_suite
from tests.kernels import variant_bugs

BUGS = sorted(variant_bugs.BUGS)


def _case(seed=0, B=2, Hq=4, Hkv=2, Lq=9, Lk=9, D=8, grad=False, **params) -> Case:
    rng = np.random.default_rng(seed)
    extra = {"grad_out": rng.normal(size=(B, Hq, Lq, D))} if grad else {}
    return Case.build(rng.normal(size=(B, Hq, Lq, D)), rng.normal(size=(B, Hkv, Lk, D)),
                      rng.normal(size=(B, Hkv, Lk, D)), **extra, **params)


SLOPES = np.array([0.5, 0.25, 0.125, 1.0])
SINKS = np.array([0.5, 2.0, -1.0, 1.5])
WITNESSES = {  # name -> (case, quantity the defect shows in)
    "window_left_exclusive": (_case(window=(2, 0)), "out"),
    "window_right_exclusive": (_case(window=(1, 2), window_align="top_left"), "out"),
    "window_symmetric": (_case(window=(3, 0)), "out"),
    "window_top_left": (_case(Lq=5, Lk=9, window=(2, 0)), "out"),
    "window_ignores_padding": (_case(window=(1, 0), q_lengths=[9, 4], kv_lengths=[9, 6]), "out"),
    "window_ignored": (_case(window=(1, 0)), "out"),
    "softcap_ignored": (_case(softcap=0.5, scale=2.0), "out"),
    "softcap_after_bias": (_case(softcap=1.0, alibi_slopes=SLOPES), "out"),
    "softcap_after_mask": (_case(softcap=1.0, causal="bottom_right"), "out"),
    "softcap_unscaled": (_case(softcap=1.0, scale=3.0), "out"),
    "softcap_no_derivative": (_case(softcap=1.0, scale=2.0, grad=True), "dq"),
    "alibi_sign": (_case(alibi_slopes=SLOPES), "out"),
    "alibi_signed_distance": (_case(alibi_slopes=SLOPES), "out"),
    "alibi_top_left": (_case(Lq=5, Lk=9, alibi_slopes=SLOPES), "out"),
    "alibi_batch_slopes_ignored": (_case(alibi_slopes=np.stack([SLOPES, SLOPES[::-1]])), "out"),
    "alibi_scaled": (_case(alibi_slopes=SLOPES), "out"),
    "alibi_row_constant": (_case(alibi_slopes=SLOPES, causal="bottom_right"), "lse"),
    "sink_ignored": (_case(sinks=SINKS), "out"),
    "sink_missing_from_lse": (_case(sinks=SINKS), "lse"),
    "sink_as_value_key": (_case(sinks=SINKS), "out"),
    "sink_scaled": (_case(sinks=SINKS), "out"),
    "sink_per_kv_head": (_case(sinks=SINKS), "out"),
    "sink_empty_row_minus_inf": (_case(Lq=9, Lk=4, sinks=SINKS, causal="bottom_right"), "lse"),
    "lse_base2": (_case(), "lse"),
    "lse_times_ln2": (_case(), "lse"),
    "lse_empty_plus_inf": (_case(Lq=9, Lk=4, causal="bottom_right"), "lse"),
    "lse_without_max": (_case(), "lse"),
}


def _quantity(impl, case: Case, what: str) -> tuple[np.ndarray, np.ndarray]:
    res = impl.run(case, grads=what == "dq")
    if what == "out":
        return res.out, oracle(case).out
    if what == "lse":
        return res.lse, oracle(case).lse
    return res.grads["dq"], backward(case).dq


def test_catalogue_is_complete():
    assert len(BUGS) >= 15
    assert set(WITNESSES) == set(BUGS)
    from attnconf import spec

    for name in BUGS:
        cls = variant_bugs.BUGS[name]
        assert cls.clause in spec.clauses() and cls.__doc__.startswith("Defect"), name


@pytest.mark.parametrize("what", ["out", "lse", "dq"])
@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_control_equals_the_reference_on_every_witness(name, what):
    case = WITNESSES[name][0]
    if what == "dq" and case.grad_out is None:
        case = case.replace(grad_out=np.ones(case.out_shape))
    got, want = _quantity(variant_bugs.correct(), case, what)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", BUGS)
def test_bug_differs_from_the_reference_on_its_witness(name):
    case, what = WITNESSES[name]
    got, want = _quantity(variant_bugs.BUGS[name](), case, what)
    with np.errstate(invalid="ignore"):
        err = np.where(np.isfinite(got) & np.isfinite(want), np.abs(got - want),
                       np.where(np.isneginf(got) & np.isneginf(want), 0.0, np.inf))
    assert err.max() > 1e-6, f"{name}: no visible defect on its witness (max {err.max():.3g})"
    if name == "alibi_row_constant":   # flash-attention 2's causal ALiBi: the output is right, only the lse moves
        out, ref = _quantity(variant_bugs.BUGS[name](), case, "out")
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_kernel_option_accepts_an_adapter_class_or_instance():
    """--kernel=MODULE:ATTR resolving to an Adapter subclass or instance uses it as is, renamed and untrusted."""
    [a] = adapters.load("numpy", kernel="tests.kernels.variant_bugs:window_ignored")
    assert isinstance(a, variant_bugs.BUGS["window_ignored"]) and a.trusted is False
    assert a.name == "numpy:kernel:tests.kernels.variant_bugs:window_ignored"
    variant_bugs.INSTANCE = variant_bugs.correct()
    try:
        [b] = adapters.load("numpy", kernel="tests.kernels.variant_bugs:INSTANCE")
        assert b is variant_bugs.INSTANCE and not b.trusted
    finally:
        del variant_bugs.INSTANCE
    with pytest.raises(adapters.UsageError, match="defines its own calling convention"):
        adapters.load("numpy", kernel="tests.kernels.variant_bugs:correct", convention="sdpa")


# ---- the suite against the catalogue (slow: one suite run per kernel) ---------------------------

@pytest.mark.slow
def test_suite_passes_the_control(tmp_path):
    run = run_suite("numpy", tmp_path / "run.json", kernel="tests.kernels.variant_bugs:correct")
    assert run.report is not None, run.output_tail
    assert run.returncode == 0 and run.report["verdict"]["verdict"] == "CONFORMANT", run.output_tail


@pytest.mark.slow
@pytest.mark.parametrize("name", BUGS)
def test_suite_catches_variant_bug(name, tmp_path, record_property):
    run = run_suite("numpy", tmp_path / "run.json", kernel=f"tests.kernels.variant_bugs:{name}", stop_at_first=True)
    assert run.report is not None, run.output_tail
    f = run.first_failure or {}
    record_property("caught_by", run.caught_by)
    record_property("seconds", round(run.wall_s, 1))
    print(f"{name}: caught by {run.caught_by} ({(f.get('clauses') or ['?'])[0]}) after {f.get('examples')} examples, "
          f"{run.wall_s:.1f} s wall")
    assert run.returncode == 1 and run.report["verdict"]["verdict"] == "NONCONFORMANT", \
        f"the suite did not catch {name} ({variant_bugs.BUGS[name].clause}):\n{run.output_tail}"


def test_reference_adapter_returns_the_sink_aware_lse_and_dsinks():
    """numpy:reference: lse includes the sink (and is the sink on rows with no key); grads carry dsinks."""
    from attnconf.adapters.numpy import ReferenceAdapter
    from attnconf.reference import round_to

    case = _case(Lq=9, Lk=4, sinks=SINKS, causal="bottom_right", grad=True, dtype="bfloat16")
    res = ReferenceAdapter().run(case, grads=True)
    ref = oracle(case)
    np.testing.assert_array_equal(res.lse, round_to(ref.lse, "float32"))
    empty = ~ref.visible.any(axis=-1)
    assert empty.any() and np.array_equal(res.lse[empty], np.broadcast_to(case.sinks[None, :, None], empty.shape)[empty])
    np.testing.assert_array_equal(res.grads["dsinks"], round_to(backward(case).dsinks, "bfloat16"))
