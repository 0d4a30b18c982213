"""The agreement panel: fixed cases every implementation runs, outputs kept for the pairwise table.

Hypothesis draws different cases on different backends, so cross-backend
agreement is measured on this fixed panel instead. Outputs are recorded as
they are (no divergence is skipped here): the pairwise table is what a user
porting a model between frameworks needs to see, differences included.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import base64

import numpy as np

from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import ConformanceFailure, NoResult, clauses, record_panel, run
from attnconf.conformance.engine.tolerance import judge_output

PANEL = {
    "P01 float32 plain": dict(seed=101, B=2, Hq=2, Lq=9, Lk=13, Dk=16),
    "P02 float32 causal top-left": dict(seed=102, Hq=2, Lq=8, Lk=8, Dk=16, causal="top_left"),
    "P03 float32 causal bottom-right Lq<Lk": dict(seed=103, Lq=5, Lk=9, Dk=16, causal="bottom_right"),
    "P04 float32 causal bottom-right Lq>Lk (empty rows)": dict(seed=104, Lq=9, Lk=5, Dk=16, causal="bottom_right"),
    "P05 float32 GQA 4/2": dict(seed=105, Hq=4, Hkv=2, Lq=7, Lk=11, Dk=16),
    "P06 float32 MQA 4/1": dict(seed=106, Hq=4, Hkv=1, Lq=7, Lk=11, Dk=16),
    "P07 float32 padding": dict(seed=107, B=2, Lq=6, Lk=10, Dk=16, kv_lengths=[4, 10], q_lengths=[6, 3]),
    "P08 float32 bias with -inf": dict(seed=108, Lq=6, Lk=6, Dk=16, bias="neginf"),
    "P09 float32 fully-masked row": dict(seed=109, Lq=6, Lk=6, Dk=16, mask="empty_row"),
    "P10 float16 plain": dict(seed=110, Lq=17, Lk=33, Dk=64, dtype="float16"),
    "P11 bfloat16 large logits": dict(seed=111, Lq=17, Lk=33, Dk=64, dtype="bfloat16", regime="large"),
    "P12 float64 plain": dict(seed=112, Lq=8, Lk=8, Dk=16, dtype="float64"),
    "P13 float32 custom scale, Dv != Dk": dict(seed=113, Lq=5, Lk=7, Dk=16, Dv=8, scale=0.3),
}


def _case(params):
    params = dict(params)
    seed = params.pop("seed")
    rng = np.random.default_rng(seed)
    if params.get("bias") == "neginf":
        b = rng.normal(size=(params["Lq"], params["Lk"]))
        b[rng.random(b.shape) < 0.3] = -np.inf
        params["bias"] = b
    if params.get("mask") == "empty_row":
        m = rng.random((params["Lq"], params["Lk"])) < 0.7
        m[2, :] = False
        params["mask"] = m
    return st.fixed_case(seed, **params)


@clauses("ATTN-OP-1")
def test_agreement_panel(impl):
    """Run the fixed panel and keep each output for the cross-implementation table."""
    for name, params in PANEL.items():
        case = _case(params)
        entry = {"case": name.split()[0], "description": name, "dtype": case.dtype, "shape": list(case.out_shape)}
        try:
            res = run(impl, case, divergence=False)
        except ConformanceFailure as exc:
            record_panel(impl, {**entry, "status": "error", "message": str(exc).splitlines()[0]})
            continue
        except NoResult:                  # recorded: the panel shows the case as unsupported and goes on
            record_panel(impl, {**entry, "status": "unsupported"})
            continue
        j = judge_output(res.out, case)
        allowance = j.allowed_max if np.isfinite(j.allowed_max) else 0.0
        record_panel(impl, {**entry, "status": "ran", "allowance": float(allowance),
                      "out_b64": base64.b64encode(np.ascontiguousarray(res.out, dtype="<f8").tobytes()).decode()})
