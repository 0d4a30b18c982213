"""The declared scope is honest (ATTN-SCOPE-1).

Cases outside an implementation's declared scope are recorded unsupported by the harness
(`Adapter.supports`), and a kernel that raises NotImplementedError is recorded unsupported
for that case. That is only sound if the declaration means something: every dtype it
declares, gradients if it declares them, and every feature it declares must run on a plain
case inside the scope. A NotImplementedError there is a failure here, not "unsupported".

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
from __future__ import annotations

import numpy as np

from attnconf.adapters.base import NotSupported
from attnconf.conformance import strategies as st
from attnconf.conformance.engine.harness import NoResult, clauses, expect, expect_close, first, invoke, run
from attnconf.conformance.engine.scope_fit import fit
from attnconf.reference import Case

# a declared feature -> the probe that exercises it (strategies.probe_cases)
FEATURE_PROBES = {"window_bottom_right": "window", "window_top_left": "window", "softcap": "softcap",
                  "alibi": "alibi", "sinks": "sinks", "mask": "mask", "bias": "bias",
                  "causal_bottom_right": "causal", "causal_top_left": "causal", "custom_scale": "scale",
                  "kv_lengths": "kv_lengths"}


def plain_case(impl, dtype: str, seed: int, **params) -> Case:
    d = 16
    heads = getattr(impl, "head_dims", None)
    if heads:
        d = min(heads, key=lambda h: abs(h - 16))
    elif impl.max_head_dim is not None:
        d = min(d, impl.max_head_dim)
    lq = lk = min(8, impl.max_seqlen or 8)
    rng = np.random.default_rng(seed)
    go = rng.normal(size=(1, 2, lq, d)) if params.pop("grads", False) else None
    return Case.build(rng.normal(size=(1, 2, lq, d)), rng.normal(size=(1, 2, lk, d)), rng.normal(size=(1, 2, lk, d)),
                      dtype=dtype, seed=seed, grad_out=go, **params)


def must_run(impl, case: Case, what: str, *, grads: bool = False) -> None:
    """The case is inside the declared scope: it must run (NotImplementedError is a failure here)."""
    fitted = fit(case, impl, need={"grads"} if grads else ())
    if fitted is None:
        expect(False, "ATTN-SCOPE-1", f"{what}: no case inside the declared scope could be built "
               f"({impl.supports(case)})", case, impl)
    try:
        invoke(impl, fitted, grads=grads)
    except NotSupported as exc:
        conv = getattr(impl, "conv", None)
        plain = conv.plain_packing(fitted, impl.adapter) if conv is not None else None
        how = conv.representation_words(fitted, impl.adapter) if conv is not None else ""
        if plain is not None and plain != fitted.packing:
            # a representation the kernel refuses (cache_batch_idx, a page size): unsupported for those cases;
            # the feature is judged on the plainest representation
            fitted = fitted.replace(packing=plain)
            try:
                invoke(impl, fitted, grads=grads)
            except NotSupported as again:
                expect(False, "ATTN-SCOPE-1", f"declares {what} but refuses a plain case of it, even with "
                       f"{conv.representation_words(fitted, impl.adapter)}: {again}", fitted, impl)
            except Exception:  # any other failure is the harness's to classify and report
                pass
        else:
            expect(False, "ATTN-SCOPE-1", f"declares {what} but refuses a plain case of it"
                   + (f" ({how})" if how else "") + f": {exc}", fitted, impl)
    except Exception:  # any other failure is the harness's to classify and report
        pass
    try:
        res = run(impl, fitted, grads=grads)
    except NoResult:      # recorded; the caller goes on to its next dtype or feature
        return
    if not fitted.dropout_p:
        expect_close(res.out, fitted, impl, clause="ATTN-SCOPE-1")


@first(1)
@clauses("ATTN-SCOPE-1")
def test_declared_dtypes_and_gradients_run(impl):
    """Each declared dtype runs a plain case; so do gradients when declared."""
    for i, dtype in enumerate(impl.dtypes):
        must_run(impl, plain_case(impl, dtype, 900 + i), dtype)
    if "grads" in impl.capabilities:
        must_run(impl, plain_case(impl, impl.dtypes[0], 950, grads=True), "gradients", grads=True)


@first(1)
@clauses("ATTN-SCOPE-1")
def test_declared_features_run(impl):
    """Each declared feature (window, softcap, ALiBi, masks, causal, ...) runs on a small probe case."""
    done = set()
    for feature in sorted(set(impl.capabilities) & set(FEATURE_PROBES)):
        probe = FEATURE_PROBES[feature]
        if probe in done:
            continue
        done.add(probe)
        align = "top_left" if feature.endswith("top_left") else "bottom_right"
        case = st.probe_case(probe, seed=970 + len(done), dtype=impl.dtypes[0], align=align, causal=align)
        must_run(impl, case, f"feature {feature}")
