"""Every declared divergence still behaves as documented on its witness case (adapters/<backend>/divergences.toml).

The witness of an entry is run without the entry and judged twice: against the spec, and against
the behaviour the entry declares instead. Its status goes to the run file, the report and the
certificate:

- "diverges as declared": the entry holds;
- "stale": the witness now conforms to the spec. Shown everywhere, never a failure of the
  implementation (it got better); `make test` fails on it where the entry's conditions hold
  (attnconf.conformance.engine.entries_check), so entries stay honest;
- "inactive here": the entry's conditions (`when`) exclude this machine; what the witness does is
  recorded, nothing is judged;
- a witness that matches neither the spec nor the declared behaviour fails the test: the
  implementation does something other than what its entry says.

PYTEST_DONT_REWRITE: these modules state the spec through harness.expect, not bare asserts.
"""
import numpy as np
import pytest

from attnconf.adapters.base import NotSupported
from attnconf.conformance.engine import alternatives
from attnconf.conformance.engine.divergences import Applied
from attnconf.conformance.engine.harness import clauses, expect, invoke, lse_need, observe
from attnconf.conformance.engine.regions import rows_of, touches
from attnconf.conformance.engine.witnesses import WITNESSES

DIVERGES, STALE, OTHER, UNRUNNABLE = "diverges as declared", "stale: the witness conforms", "other", "not runnable here"


def _as_layer(case):
    """The layer form of an attention witness: same batch, lengths, heads, dtype and visibility."""
    from attnconf.reference import oracle
    from attnconf.reference.layer import random_layer_case

    s = case.shape
    vis = oracle(case).visible[:, 0]
    mask = None if vis.all() else vis
    return random_layer_case(np.random.default_rng(case.seed), s["B"], s["Lq"], s["Lk"], 8 * s["Hq"], s["Hq"],
                             dtype=case.dtype, mask=mask)


def witness_status(impl, entry) -> tuple[str, str]:
    """(status, detail) of one entry's witness on this implementation, called through the one call path
    (`harness.invoke`: the session's timeout, and a crash or a hang ends the test as it does anywhere)."""
    adapter = impl.adapter
    case = WITNESSES[entry["witness"]]()
    layer = getattr(adapter, "kind", "sdpa") == "layer"
    if layer and not hasattr(case, "num_heads"):
        case = _as_layer(case)
    grads = bool(set(entry["quantities"]) & set(alternatives.GRADIENTS))
    if not layer and grads and case.grad_out is None:
        case = case.replace(grad_out=np.random.default_rng(0).normal(size=case.out_shape))
    if entry["instead"] == "returns":                      # an invalid call that must raise (ATTN-OP-6)
        try:
            out = invoke(impl, case, form="raw")
        except NotImplementedError:
            return UNRUNNABLE, "cannot be called on raw shapes"
        except Exception:
            return STALE, "the invalid call raises now"
        return DIVERGES, f"returned an output of shape {tuple(np.shape(out))}"
    try:
        lse = lse_need(adapter, case) if "lse" in entry["quantities"] else frozenset()
        ok = adapter.supports_layer(case) if layer else adapter.supports(
            case, need=frozenset({"grads"} if grads else ()) | lse)
    except Exception as exc:    # the framework's own capability probe raised on the witness (e.g. torch's rank-1 mask)
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        if entry["instead"] == "raises":
            return DIVERGES, f"raised {type(exc).__name__}: {first}"
        return OTHER, f"the capability probe raised {type(exc).__name__}: {first}"
    if ok is not True:
        return UNRUNNABLE, str(ok)
    try:
        res = invoke(impl, case, form="layer" if layer else "sdpa", grads=grads)
    except Exception as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        if isinstance(exc, NotSupported) and entry["instead"] != "raises":   # the kernel says: not this case
            return UNRUNNABLE, str(exc)
        if entry["instead"] == "raises":
            return DIVERGES, f"raised {type(exc).__name__}: {first}"
        return OTHER, f"raised {type(exc).__name__}: {first}"
    if entry["instead"] == "output_float32":
        if res.out_dtype == case.dtype:
            return STALE, f"the output dtype is {case.dtype} now"
        return (DIVERGES, "") if res.out_dtype == "float32" else (OTHER, f"the output dtype is {res.out_dtype}")
    if entry["instead"] == "raises":
        full = alternatives.conforms(case, res, _all_masks(case, res, layer))
        return (STALE, "returns a conforming result") if full else (OTHER, "returns a non-conforming result")
    rows = rows_of(entry["region"], case)
    if not touches(rows):
        return OTHER, f"the witness {entry['witness']!r} lies outside the region {entry['region']!r}"
    applied = Applied(entry, rows)
    masks = applied.masks(case, res) if not layer else {
        "out": np.broadcast_to((np.ones(res.out.shape[:2], bool) if rows is None else rows)[..., None], res.out.shape)}
    if not masks:
        return UNRUNNABLE, f"{adapter.name} returns none of {entry['quantities']}"
    if alternatives.conforms(case, res, masks):
        return STALE, "the covered elements conform to the spec"
    verdict = alternatives.ALTERNATIVES[entry["instead"]].check(entry, case, res, masks)
    return (DIVERGES, "") if verdict.ok else (OTHER, verdict.detail)


def _all_masks(case, res, layer: bool) -> dict[str, np.ndarray]:
    masks = {"out": np.ones(np.shape(res.out), bool)}
    if not layer and res.lse is not None:
        masks["lse"] = np.ones(np.shape(res.lse), bool)
    for name, g in (res.grads or {}).items():
        masks[name] = np.ones(np.shape(g), bool)
    return masks


def _check(impl):
    session = impl.session
    entries = session.divergences.for_impl(impl.name, active_only=False) if session.divergences else []
    entries = [e for e in entries if e.get("witness")]     # a kernel's declared behaviour has none (declared.py)
    if not entries:
        pytest.skip(f"no divergence declared for {impl.name}")
    wrong = []
    for entry in entries:
        status, detail = witness_status(impl, entry)
        if not entry["holds"]:
            observe(impl, "WITNESS", entry["id"], {"status": "inactive here", "why": entry["condition"],
                                                   "witness": status, "detail": detail})
            continue
        observe(impl, "WITNESS", entry["id"], {"status": status, "detail": detail})
        if status == OTHER:
            wrong.append(f"{entry['id']} ({detail})")
        if status == DIVERGES:
            impl.record.note_divergent(entry["id"])
    impl.record.note_ran()
    expect(not wrong, "ATTN-OP-1", "the witness behaves neither as the spec says nor as the entry declares: "
           + "; ".join(wrong), None, impl)


@clauses("ATTN-OP-1")
def test_witnesses_behave_as_declared(impl):
    """Each divergence declared for this implementation shows, on its witness, what the entry says."""
    _check(impl)


@clauses("ATTN-MHA-1")
def test_layer_witnesses_behave_as_declared(layer_impl):
    """Each divergence declared for this layer implementation shows what the entry says on its witness."""
    _check(layer_impl)
