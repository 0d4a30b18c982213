"""Arguments are honoured (ATTN-ARG-1): turning a feature on moves the output as the spec says.

A kernel can accept an argument and ignore it: SageAttention's `**kwargs` swallows
`attn_mask` and `dropout_p`, sgl-project/sglang#33915 accepted a softcap and dropped it,
jax-ml/jax#23349 ignored `key_value_seq_lengths`. Agreement on random cases catches that only
if the feature happens to matter in them; each probe here is built so that it matters a lot
(`strategies.probe_cases`: a window of a few keys, softcap 1 on logits ~ 10, slopes ~ 1, ...).

For each feature the implementation declares, a probe case runs with the feature on and with
it off. With A the plain case's allowance (section 12), every row that the spec moves by more
than 4 A must not come out as the plain answer within A: a kernel whose error on the row is
below 3 A never does (|out - ref_off| >= |ref_on - ref_off| - |out - ref_on| > A), a kernel
that ignores the argument always does, even for some heads or rows only. Then both outputs
are judged as usual. Dropout has no deterministic reference: with p = 0.5 on one-hot V, some
weight must change.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import clauses, expect, expect_close, first, for_cases, run
from attnconf.conformance.engine.nan_aware import max_gap
from attnconf.conformance.engine.scope_fit import fit
from attnconf.conformance.engine.tolerance import judge_output
from attnconf.reference import Case, oracle

OFF = {"window": {"window": None}, "softcap": {"softcap": None}, "alibi": {"alibi_slopes": None},
       "sinks": {"sinks": None}, "mask": {"mask": None}, "bias": {"bias": None}, "causal": {"causal": None},
       "dropout": {"dropout_p": 0.0}, "scale": {"scale": None}, "kv_lengths": {"kv_lengths": None}}


def describe(case: Case, feature: str) -> str:
    return {"window": lambda: f"window={list(case.window)}@{case.window_align}",
            "softcap": lambda: f"softcap={case.softcap:g}", "alibi": lambda: "alibi_slopes",
            "sinks": lambda: "sinks", "mask": lambda: "a boolean mask", "bias": lambda: "an additive bias",
            "causal": lambda: f"causal={case.causal}", "dropout": lambda: f"dropout_p={case.dropout_p:g}",
            "scale": lambda: f"scale={case.scale:g}", "kv_lengths": lambda: f"kv_lengths={case.kv_lengths.tolist()}"
            }[feature]()


def still_on(case: Case, feature: str) -> bool:
    """Did fitting keep the feature the probe is about?"""
    return {"window": case.window is not None, "softcap": case.softcap is not None,
            "alibi": case.alibi_slopes is not None, "sinks": case.sinks is not None, "mask": case.mask is not None,
            "bias": case.bias is not None, "causal": case.causal is not None, "dropout": bool(case.dropout_p),
            "scale": case.scale is not None, "kv_lengths": case.kv_lengths is not None}[feature]


def check_probe(impl, case: Case, feature: str) -> None:
    fitted = fit(case, impl)
    if fitted is None or not still_on(fitted, feature):
        run(impl, case)                                     # recorded as unsupported, with its reason
        return
    on = fitted
    off = on.replace(**OFF[feature])
    r_on, r_off = run(impl, on), run(impl, off)
    what = describe(on, feature)
    moved = max_gap(r_on.out, r_off.out, nan_equal=False)
    j_off = judge_output(r_off.out, off)
    if feature == "dropout":
        expect(moved > 2 * j_off.allowed_max, "ATTN-ARG-1",
               f"turning on {what} left every output entry within {moved:.3g} of the p = 0 output "
               f"(allowance {j_off.allowed_max:.3g}): dropout was accepted and ignored", on, impl)
        expect_close(r_off.out, off, impl, clause="ATTN-ARG-1")
        return
    # Row by row: where the spec moves a row by more than 4 x the plain case's allowance, the kernel's
    # row with the feature on must not be the plain answer (within that allowance). Only the plain case's
    # allowance is used: it is sound whatever the feature, while a yardstick that does not model the
    # feature would make the on-case's allowance loose.
    ref_on, ref_off = oracle(on).out, oracle(off).out
    a = j_off.allowed_max
    with np.errstate(invalid="ignore"):
        spec_moves = max_gap(ref_on, ref_off, axis=-1) > 4 * a
        stays = max_gap(r_on.out, ref_off, axis=-1, nan_equal=False) <= a  # a NaN row is never "the answer without it"
    ignored = np.argwhere(spec_moves & stays)
    if ignored.size:
        row = tuple(int(i) for i in ignored[0])
        expect(False, "ATTN-ARG-1", f"turning on {what}: {len(ignored)} of {int(spec_moves.sum())} rows the spec moves "
               f"(by more than 4 x {a:.3g}) are the answer without it, within {a:.3g}; first row {row} moved by "
               f"{float(np.abs(r_on.out[row] - r_off.out[row]).max()):.3g}, the spec moves it by "
               f"{float(np.abs(ref_on[row] - ref_off[row]).max()):.3g}: the argument was accepted and ignored", on, impl)
    expect_close(r_on.out, on, impl, clause="ATTN-ARG-1")
    expect_close(r_off.out, off, impl, clause="ATTN-ARG-1")


def _probe(feature: str):
    def probe(impl, case):
        check_probe(impl, case, feature)
    probe.__name__ = probe.__qualname__ = f"test_{feature}_argument_is_honoured"
    probe.__doc__ = f"Turning on {feature} moves the output by what the spec says (ATTN-ARG-1)."
    return first(2)(clauses("ATTN-ARG-1")(for_cases(st.probe_cases(feature), weight=0.12, needs=(NEEDS[feature],))(probe)))


# the capability a probe of each argument needs (adapters/base.py CAPABILITIES)
NEEDS = {"window": "window_top_left|window_bottom_right", "softcap": "softcap", "alibi": "alibi|alibi_top_left",
         "sinks": "sinks", "mask": "mask", "bias": "bias", "causal": "causal_top_left|causal_bottom_right",
         "dropout": "dropout", "scale": "custom_scale", "kv_lengths": "kv_lengths"}


test_window_argument_is_honoured = _probe("window")
test_softcap_argument_is_honoured = _probe("softcap")
test_alibi_argument_is_honoured = _probe("alibi")
test_sinks_argument_is_honoured = _probe("sinks")
test_mask_argument_is_honoured = _probe("mask")
test_bias_argument_is_honoured = _probe("bias")
test_causal_argument_is_honoured = _probe("causal")
test_dropout_argument_is_honoured = _probe("dropout")
test_scale_argument_is_honoured = _probe("scale")
test_kv_lengths_argument_is_honoured = _probe("kv_lengths")
