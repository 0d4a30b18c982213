"""Every declared divergence still shows on its witness case (spec/divergences/<backend>.toml).

An entry whose witness now conforms is stale: the run fails until the entry is
removed, so the list of divergences never hides a fixed bug or a new one.
"""
import numpy as np
import pytest

from attnconf.conformance.harness import SESSION, ConformanceFailure, clauses, expect, observe, run
from attnconf.conformance.tolerance import judge_gradients, judge_layer, judge_lse, judge_output
from attnconf.conformance.witnesses import WITNESSES

LSE_CLAUSES = {"ATTN-EMPTY-2", "ATTN-W-3"}
GRAD_CLAUSES = {"ATTN-EMPTY-3", "ATTN-GRAD-1", "ATTN-GRAD-2", "ATTN-TOL-5"}


def _diverges(adapter, entry) -> bool | None:
    """True if the witness still departs from the spec, False if it conforms, None if it cannot run here."""
    case = WITNESSES[entry["witness"]]()
    if getattr(adapter, "kind", "sdpa") == "layer" and not hasattr(case, "num_heads"):
        case = _as_layer(case)
    if hasattr(case, "num_heads"):
        if getattr(adapter, "kind", "sdpa") != "layer" or adapter.supports_layer(case) is not True:
            return None
        try:
            return not judge_layer(np.asarray(adapter.run_layer(case), dtype=np.float64), case).ok
        except Exception:
            return True
    if getattr(adapter, "kind", "sdpa") != "sdpa":
        return None
    if entry["clause"] == "ATTN-OP-6":       # invalid input must raise: diverges if it returns
        try:
            adapter.run_raw(case.q, case.k, case.v, case.dtype)
        except Exception:
            return False
        return True
    grads = entry["clause"] in GRAD_CLAUSES or entry["scope"] == "gradients"
    if grads and case.grad_out is None:
        case = case.replace(grad_out=np.random.default_rng(0).normal(size=case.out_shape))
    need = {"lse"} if entry["clause"] in LSE_CLAUSES else set()
    try:
        res = run(adapter, case, grads=grads, need=need, divergence=False)
    except ConformanceFailure:
        return True            # raising, or a broken contract, is a departure too
    if res is None:
        return None
    if grads:
        return not all(j.ok for j in judge_gradients(res.grads or {}, case))
    if need:
        return res.lse is None or not judge_lse(res.lse, case).ok
    return not judge_output(res.out, case).ok


def _as_layer(case):
    """The layer form of an attention witness: same batch, lengths, heads, dtype and visibility."""
    from attnconf.reference import oracle
    from attnconf.reference.layer import random_layer_case

    s = case.shape
    vis = oracle(case).visible[:, 0]
    mask = None if vis.all() else vis
    return random_layer_case(np.random.default_rng(case.seed), s["B"], s["Lq"], s["Lk"], 8 * s["Hq"], s["Hq"],
                             dtype=case.dtype, mask=mask)


def _check(adapter):
    entries = SESSION.divergences.for_impl(adapter.name) if SESSION.divergences else []
    if not entries:
        pytest.skip(f"no divergence declared for {adapter.name}")
    stale = []
    for entry in entries:
        verdict = _diverges(adapter, entry)
        status = {True: "diverges", False: "STALE: witness conforms", None: "not runnable here"}[verdict]
        observe("WITNESS", entry["id"], status)
        if verdict is False:
            stale.append(entry["id"])
    expect(not stale, "ATTN-OP-1", f"stale divergence entries (their witnesses now conform): {', '.join(stale)}",
           None, adapter)


@clauses("ATTN-OP-1")
def test_witnesses_still_diverge(impl):
    """Each divergence declared for this implementation still shows on its witness."""
    _check(impl)


@clauses("ATTN-MHA-1")
def test_layer_witnesses_still_diverge(layer_impl):
    """Each divergence declared for this layer implementation still shows on its witness."""
    _check(layer_impl)
