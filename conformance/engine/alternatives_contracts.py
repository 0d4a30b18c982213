"""The accuracy contract of an approximate kernel (SPEC section 29, ATTN-QUANT-1..4).

A kernel that quantizes its inputs cannot meet ATTN-TOL-1 and should not hide behind a hand-made
divergence. It declares instead, in its scope (`attnconf_capabilities` or `--capabilities`), either

- ``quantization = {scheme = "int8_per_block", q_block = 128, k_block = 64, smooth_k = true,
  pv = "float16"}`` or ``{scheme = "fp8_e4m3_per_head"}``: judged against the float64 reference of
  the inputs quantized exactly as declared (`reference.quantize.quantized_case`), under the
  tolerance model of that computation (its naive baseline at the case's dtype; with ``pv =
  "float16"`` at least the error of P V accumulated in half precision); or
- ``accuracy = {cosine = 0.999, rel_l1 = 0.03}``: each output against the float64 reference of the
  case itself, by cosine similarity and relative L1 distance.

The declaration becomes a divergence entry (`contract_entries`) with region "any", the clause of
its kind (ATTN-QUANT-1 scheme, -2 class, -3 a convention's default) and one of the two alternatives below; the harness then keeps the kernel's raw output
for the exact properties (`Result.notes["raw_out"]`, bitwise causality), which therefore still hold.
The worst cosine and relative L1 against float64 seen per dtype are written into the entry's
`measured` field, which the run file and the certificate print.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from attnconf.reference import Case, oracle
from attnconf.adapters.accuracy_contract import ACCURACY_KEYS, INT8_DEFAULTS, ContractError, parse  # noqa: F401  (the judge reads the parsed form)

from attnconf.conformance.engine import tolerance as T
from attnconf.conformance.engine.alternatives import Alternative, ALTERNATIVES, Verdict, _judged
from attnconf.conformance.engine.witnesses import witness

CONTRACT_CLAUSE = "ATTN-QUANT-1"       # a declared quantization scheme
CLASS_CLAUSE = "ATTN-QUANT-2"          # a declared accuracy class
DEFAULT_CLAUSE = "ATTN-QUANT-3"        # a convention's default scheme (sageattn's), undeclared by the kernel
def describe(contract: dict[str, Any]) -> str:
    if "quantization" in contract:
        return "quantization " + ", ".join(f"{k}={v}" for k, v in contract["quantization"].items())
    return "accuracy class " + ", ".join(f"{k} {'>=' if k == 'cosine' else '<='} {v:g}"
                                         for k, v in contract["accuracy"].items())


def contract_entries(impls: list) -> list[dict[str, Any]]:
    """One divergence entry per implementation that carries a contract (`adapter.accuracy_contract`)."""
    out = []
    for a in impls:
        contract = getattr(a, "accuracy_contract", None)
        if not contract:
            continue
        kind = "quantized_reference" if "quantization" in contract else "accuracy_class"
        default = bool(contract.get("default"))       # a convention's scheme, not the kernel's declaration
        clause = DEFAULT_CLAUSE if default else CONTRACT_CLAUSE if kind == "quantized_reference" else CLASS_CLAUSE
        out.append({"id": "CONTRACT-" + re.sub("[^A-Z0-9]+", "-", a.name.upper()).strip("-"), "clause": clause, "kind": "divergent",
                    "implementations": [a.name], "region": "any", "instead": kind, "bound": 1.0,
                    "reason": f"declared accuracy contract: {describe(contract)}", "witness": "contract_witness",
                    "contract": contract, "file": "the kernel's declared scope", "dtypes": [], "measured": ""})
    return out


def _accuracy(actual: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> tuple[float, float] | None:
    """(cosine, relative L1) of the covered elements against the reference; None where the reference is 0."""
    a, r = np.asarray(actual, np.float64)[mask], np.asarray(ref, np.float64)[mask]
    fin = np.isfinite(r)
    a, r = a[fin], r[fin]
    nr, na = float(np.linalg.norm(r)), float(np.linalg.norm(a)) if np.isfinite(a).all() else np.inf
    if nr == 0 or not np.isfinite(na):
        return None if nr == 0 else (-np.inf, np.inf)
    cos = float(a @ r) / (na * nr) if na > 0 else 0.0
    return cos, float(np.abs(a - r).sum() / np.abs(r).sum())


def _record(entry: dict[str, Any], dtype: str, figures: tuple[float, float] | None) -> None:
    """Keep the worst cosine and relative L1 per dtype on the entry, and its `measured` sentence."""
    if figures is None:
        return
    seen = entry.setdefault("_accuracy", {})
    cos, rel = figures
    w = seen.setdefault(dtype, {"cosine": 1.0, "rel_l1": 0.0, "cases": 0})
    w["cosine"], w["rel_l1"], w["cases"] = min(w["cosine"], cos), max(w["rel_l1"], rel), w["cases"] + 1
    entry["measured"] = "measured against float64: " + "; ".join(
        f"{dt}: worst cosine {v['cosine']:.6f}, worst rel_l1 {v['rel_l1']:.3g} over {v['cases']} outputs"
        for dt, v in sorted(seen.items()))


def _nonfinite(actual: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> Verdict | None:
    bad = mask & np.isfinite(ref) & ~np.isfinite(np.asarray(actual, np.float64))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return Verdict(False, f"{int(bad.sum())} output element(s) are NaN or inf where the reference is finite; "
                              f"first at {idx}")
    return None


def _quantized_reference(entry, case: Case, res, masks) -> Verdict:
    """The kernel against the reference of its declared quantization (ATTN-QUANT-1, -2)."""
    from attnconf.reference import baseline_error
    from attnconf.reference.emulate import half_accumulation_error
    from attnconf.reference.quantize import quantized_case

    scheme = entry["contract"]["quantization"]
    qcase = quantized_case(case, scheme)
    qref = oracle(qcase)
    if "out" in masks:
        # rows whose quantized problem is not finite (V beyond the declared PV format) lie outside the
        # scheme's range: accepted as they are, like every element the contract covers
        judged = masks["out"] & np.isfinite(qref.out)
        bad = _nonfinite(res.out, qref.out, judged)
        if bad:
            return bad
        with np.errstate(invalid="ignore"):
            base = baseline_error(qcase)[0]
            if scheme.get("pv") == "float16" and case.dtype != "float64":
                base = np.maximum(base, half_accumulation_error(qcase))
        j = T.judge_arrays(np.asarray(res.out), qref.out, base, case.dtype,
                           quantity=f"out (against the {scheme['scheme']} reference)", mask=judged,
                           factor=float(entry.get("bound", 1.0)))
        if not j.ok:
            return _judged(j)
        _record(entry, case.dtype, _accuracy(res.out, oracle(case).out, judged))
    if "lse" in masks and res.lse is not None:
        j = T.judge_lse(np.asarray(res.lse), qcase, mask=masks["lse"], factor=float(entry.get("bound", 1.0)))
        if not j.ok:
            return _judged(j)
    return Verdict(True)


def _accuracy_class(entry, case: Case, res, masks) -> Verdict:
    """Each output against the float64 reference by cosine and relative L1 (ATTN-QUANT-3)."""
    want = entry["contract"]["accuracy"]
    ref = oracle(case)
    if "out" in masks:
        bad = _nonfinite(res.out, ref.out, masks["out"])
        if bad:
            return bad
        fig = _accuracy(res.out, ref.out, masks["out"])
        _record(entry, case.dtype, fig)
        if fig is not None:
            cos, rel = fig
            if cos < want.get("cosine", -np.inf) or rel > want.get("rel_l1", np.inf):
                return Verdict(False, f"cosine {cos:.6f} and rel_l1 {rel:.3g} against float64; the declared class is "
                                      f"{describe(entry['contract'])}")
    if "lse" in masks and res.lse is not None:
        lse, r = np.asarray(res.lse, np.float64), ref.lse
        m = masks["lse"] & np.isfinite(r)
        if (m & ~np.isfinite(lse)).any():
            return Verdict(False, "lse is NaN or inf where the reference is finite")
        # the lse is the log of the normaliser: a relative L1 of rel on the weights moves it by about rel
        tol = want.get("rel_l1", 1.0)
        if m.any() and float(np.abs(lse - r)[m].max()) > tol:
            return Verdict(False, f"lse off by {float(np.abs(lse - r)[m].max()):.3g} > {tol:g} (the declared rel_l1)")
    return Verdict(True)


ALTERNATIVES["quantized_reference"] = Alternative("quantized_reference", ("out", "lse"), _quantized_reference,
                                                  numeric=True, takes_bound=True)
ALTERNATIVES["accuracy_class"] = Alternative("accuracy_class", ("out", "lse"), _accuracy_class,
                                             numeric=True, takes_bound=True)


@witness
def contract_witness() -> Case:
    """A float16 case with keys offset by a common vector (where smooth-K matters), one 64-key block."""
    rng = np.random.default_rng(26)
    q, k, v = rng.normal(size=(1, 2, 64, 64)), rng.normal(size=(1, 2, 64, 64)) + 4.0, rng.normal(size=(1, 2, 64, 64))
    return Case.build(q, k, v, dtype="float16")
