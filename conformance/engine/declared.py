"""A kernel's documented behaviour (adapters/contract.py) as divergence entries it owns.

`empty_rows`, `compute_dtype` and `scale_rounding` each become one or two entries of the same
shape as those of adapters/<backend>/divergences.toml: a region, an alternative (`instead`), the
quantities and dtypes they cover, owned by the one implementation that declared them. The harness
then applies them element by element like any other entry (harness.run): inside the region the
kernel is held to its declared behaviour, and a contradiction fails the entry's clause; outside,
everything is judged as usual. They need no witness: the run itself shows whether a declaration
was exercised (`examples`, counted from the records) and the run file says so.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from attnconf.reference import Case, round_to

from attnconf.conformance.engine.alternatives import ALTERNATIVES, FORWARD, GRADIENTS, PRECISION_ORDER, Verdict, _judge_against, alternative
from attnconf.conformance.engine.regions import case_region

PREFIX = "DECLARED-"


@case_region
def declared_compute_dtype(case) -> bool:
    """Every case (a `compute_dtype` declaration narrows it with the dtypes above its precision)."""
    return True


def _effective_scale(case: Case) -> float:
    return float(case.scale) if case.scale is not None else 1.0 / float(np.sqrt(case.shape["Dk"]))


@case_region
def scale_changed_by_input_dtype(case) -> bool:
    """Cases whose scale (given, or 1/sqrt(Dk)) is not exactly representable in the input dtype."""
    if hasattr(case, "num_heads"):
        return False
    s = _effective_scale(case)
    return float(round_to(np.array(s), case.dtype)) != s


@alternative("scale_input_dtype", FORWARD + GRADIENTS, numeric=True)
def _scale_input_dtype(entry, case, res, masks) -> Verdict:
    """The reference with the scale rounded to the input dtype, under that dtype's usual tolerance."""
    rounded = float(round_to(np.array(_effective_scale(case)), case.dtype))
    return _judge_against(case.replace(scale=rounded), case, res, masks)


@alternative("zero_rows", ("out",))
def _zero_rows(entry, case, res, masks) -> Verdict:
    """Every covered output element is exactly 0: the spec's own value for a row that sees no key, so a kernel
    that keeps this promise conforms there (it is not counted as divergent)."""
    v = ALTERNATIVES["zero"].check(entry, case, res, masks)
    return Verdict(True, "conforms to the spec here") if v.ok else v


def _entry(name: str, suffix: str, clause: str, region: str, instead: str, quantities: list[str],
           dtypes: list[str], impl: str, words: str, source: str) -> dict[str, Any]:
    return {"id": f"{PREFIX}{name.upper().replace('_', '-')}{suffix}", "clause": clause, "kind": "divergent",
            "implementations": [impl], "region": region, "instead": instead, "quantities": quantities,
            "dtypes": dtypes, "when": {}, "holds": True, "condition": "declared by the kernel",
            "reason": f"declared by the kernel ({source}): {words}", "measured": "", "link": None,
            "witness": None, "declared": words}


def entries(adapter: Any) -> list[dict[str, Any]]:
    """The divergence entries of one adapter's declared behaviour (none without a contract)."""
    contract = getattr(adapter, "contract", None)
    if contract is None:
        return []
    name, src, caps = adapter.name, contract.source, set(getattr(adapter, "capabilities", ()))
    grads = "grads" in caps
    out = []
    rows = contract.behaviours.get("empty_rows")
    if rows is not None:
        words = f'empty_rows = "{rows}"'
        fwd = {"nan": ["out"], "zero": ["out"], "mean_of_values": ["out", "lse"]}[rows]
        instead = "zero_rows" if rows == "zero" else rows
        out.append(_entry("empty_rows", "", "ATTN-EMPTY-1", "fully_masked_rows", instead, fwd, [], name, words, src))
        back = {"nan": "nan_or_spec", "mean_of_values": "uniform_weight_gradients"}.get(rows)
        if grads and back:
            out.append(_entry("empty_rows", "-GRADS", "ATTN-EMPTY-3", "fully_masked_rows", back, list(GRADIENTS), [],
                              name, words, src))
    low = contract.behaviours.get("compute_dtype")
    if low is not None:
        words = f'compute_dtype = "{low}"'
        above = [d for d in PRECISION_ORDER[PRECISION_ORDER.index(low) + 1:] if d in adapter.dtypes]
        if above:
            out.append(_entry("compute_dtype", "", "ATTN-TOL-1", "declared_compute_dtype", f"{low}_precision",
                              list(FORWARD), above, name, words, src))
            if grads:
                out.append(_entry("compute_dtype", "-GRADS", "ATTN-TOL-5", "declared_compute_dtype",
                                  f"{low}_precision", list(GRADIENTS), above, name, words, src))
    if contract.behaviours.get("scale_rounding") == "input_dtype":
        out.append(_entry("scale_rounding", "", "ATTN-OP-4", "scale_changed_by_input_dtype", "scale_input_dtype",
                          list(FORWARD + (GRADIENTS if grads else ())), [], name, 'scale_rounding = "input_dtype"',
                          src))
    return out


def examples(records: list[dict[str, Any]], entry_id: str) -> int:
    """How many examples an entry's region covered in these records (divergent or conforming there)."""
    return sum((r.get("divergent_by_entry") or {}).get(entry_id, 0) + (r.get("conformed_in_region") or {}).get(entry_id, 0)
               for r in records)


def sentence(d: dict[str, Any]) -> str:
    """One sentence for the certificate or the summary: what was declared and how often it was checked."""
    n = d.get("examples", 0)
    if d.get("contradicted"):
        return f"{d['declared']} ({d['id']}, {d['clause']}): CONTRADICTED: the kernel does not do what it declares"
    if not n:
        return f"{d['declared']} ({d['id']}, {d['clause']}): never exercised: no example reached its region"
    return f"{d['declared']} ({d['id']}, {d['clause']}): checked on {n} example(s)"

