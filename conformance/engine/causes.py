"""One finding per cause: the failures of a run grouped by the behaviour that explains them.

A single behaviour (NaN on rows that see no key, a scale that is ignored) fails many clauses and
tests; listed one failure at a time, the author has to find the common cause by hand. A *diagnosis*
is a hypothesis about what the kernel computes instead of the spec: it re-computes the expected
output under that hypothesis and says whether the kernel's output on the failing case matches it
within the tolerance model (the same allowance the spec's own check uses, at the hypothesised
precision where the hypothesis is a precision). The first diagnosis that explains a failing case
names its cause; a failure no diagnosis explains is its own cause, one per failed clause.

Where the behaviour is one a kernel may document, the cause names the declaration that would state
it (`empty_rows = "nan"`, `compute_dtype = "bfloat16"`, `scale_rounding = "input_dtype"`): a kernel
that does what its documentation says gets a declaration to write, not a bug to hunt.

The plugin calls `diagnose` on each failing record (with the case and the kernel's output that
`harness.run` kept) and `Keeper` decides which failing cases are saved as `.npz`: one per cause and
one per failed clause, never one per failing test. `group` turns the records into the run file's
`causes` list.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from attnconf.adapters import Result
from attnconf.reference import Case, baseline_error, oracle
from attnconf.spec.vocabulary import DTYPES, FAILING

from attnconf.conformance.engine import alternatives
from attnconf.conformance.engine import tolerance as T

UNEXPLAINED = "unexplained"
# precisions from the most to the least accurate: a lower-precision hypothesis is tried only below the case's own
PRECISIONS = DTYPES
BLOCKS = (16, 32, 64, 128)          # key blocks a kernel may pad with zero keys it then attends
OTHERS = 8                          # other calls of the failing test tried when the failing case's output is not explained


@dataclass(frozen=True)
class Diagnosis:
    name: str                               # the cause's id in the run file
    title: str                              # what the kernel does, one line
    declaration: str | None                 # the capability that documents it (None: always a bug)
    explains: Callable[[Case, np.ndarray], bool] | None = None    # None: decided by the failed clause
    clause: str | None = None               # a clause whose failure is this cause by itself


def _spec_rows_ok(case: Case, out: np.ndarray, rows: np.ndarray) -> bool:
    """The rows outside `rows` conform to the spec (the hypothesis must explain the whole output)."""
    keep = np.broadcast_to(~rows[..., None], out.shape)
    return not keep.any() or T.judge_output(out, case, mask=keep).ok


def _empty_rows(instead: str) -> Callable[[Case, np.ndarray], bool]:
    def explains(case: Case, out: np.ndarray) -> bool:
        rows = ~oracle(case).visible.any(axis=-1)
        if not rows.any():
            return False
        masks = {"out": np.broadcast_to(rows[..., None], out.shape).copy()}
        verdict = alternatives.ALTERNATIVES[instead].check({"instead": instead}, case, Result(out=out, out_dtype=case.dtype),
                                                         masks)
        return verdict.ok and _spec_rows_ok(case, out, rows)
    return explains


def _as_case(alt: Callable[[Case], Case | None]) -> Callable[[Case, np.ndarray], bool]:
    """A hypothesis that the kernel solves another problem: the output is judged against that problem's reference."""
    def explains(case: Case, out: np.ndarray) -> bool:
        other = alt(case)
        return other is not None and T.judge_output(out, other).ok
    return explains


def _scale_ignored(case: Case) -> Case | None:
    if case.scale is None or case.scale == 1.0 / np.sqrt(case.shape["Dk"]):
        return None
    return case.replace(scale=None)


def _scale_rounded(case: Case) -> Case | None:
    from attnconf.reference.case import round_to

    if case.scale is None or case.dtype == "float64":
        return None
    rounded = float(round_to(np.asarray(case.scale, dtype=np.float64), case.dtype))
    return None if rounded == case.scale else case.replace(scale=rounded)


def _causal_swapped(frm: str, to: str) -> Callable[[Case], Case | None]:
    def alt(case: Case) -> Case | None:
        s = case.shape
        if case.causal != frm or s["Lq"] == s["Lk"]:
            return None
        return case.replace(causal=to)
    return alt


def _zero_keys_attended(case: Case, out: np.ndarray) -> bool:
    """Keys padded with zeros up to a multiple of a block and attended (a tile whose tail is not masked)."""
    s = case.shape
    if (case.causal is not None or case.window is not None or case.kv_lengths is not None or case.alibi_slopes is not None
            or case.sinks is not None):
        return False
    for block in BLOCKS:
        extra = -s["Lk"] % block
        if extra == 0:
            continue
        keys = [(0, 0), (0, 0), (0, extra), (0, 0)]
        mask = bias = None
        if case.mask is not None:
            if case.mask.shape[-1] != 1:
                mask = np.pad(case.mask, [(0, 0)] * (case.mask.ndim - 1) + [(0, extra)], constant_values=True)
            else:
                mask = case.mask
        if case.bias is not None:
            bias = case.bias if case.bias.shape[-1] == 1 else np.pad(case.bias, [(0, 0)] * (case.bias.ndim - 1) + [(0, extra)])
        other = case.replace(k=np.pad(case.k, keys), v=np.pad(case.v, keys), mask=mask, bias=bias)
        if T.judge_output(out, other).ok:
            return True
    return False


def _computed_in(dtype: str) -> Callable[[Case, np.ndarray], bool]:
    """The tolerance model at `dtype`: c_max x the error of a naive `dtype` implementation on the same inputs
    plus the distance between the `dtype`-rounded problem's reference and this one's."""
    def explains(case: Case, out: np.ndarray) -> bool:
        if PRECISIONS.index(dtype) <= PRECISIONS.index(case.dtype):
            return False
        low = case.replace(dtype=dtype)
        ref, ref_low = oracle(case).out, oracle(low).out
        with np.errstate(invalid="ignore"):
            gap = np.nan_to_num(np.abs(ref_low - ref), nan=0.0, posinf=0.0)
        return T.judge_arrays(out, ref, baseline_error(low)[0] + gap, dtype).ok
    return explains


# Tried in this order: the precise behaviours first, a lower precision (which loosens every allowance) last.
DIAGNOSES: tuple[Diagnosis, ...] = (
    Diagnosis("argument_mutated", "an input argument is changed in place", None, clause="ATTN-OP-8"),
    Diagnosis("empty_rows_nan", "rows that see no key are NaN", 'empty_rows = "nan"', _empty_rows("nan")),
    Diagnosis("empty_rows_zero", "rows that see no key are 0", 'empty_rows = "zero"', _empty_rows("zero")),
    Diagnosis("empty_rows_mean_of_values", "rows that see no key are the mean of the values of their hidden keys",
              'empty_rows = "mean_of_values"', _empty_rows("mean_of_values")),
    Diagnosis("scale_ignored", "the custom scale is ignored: 1/sqrt(Dk) is used", None, _as_case(_scale_ignored)),
    Diagnosis("scale_rounded", "the scale is rounded to the input dtype before use", 'scale_rounding = "input_dtype"',
              _as_case(_scale_rounded)),
    Diagnosis("causal_top_left", "causal masking is aligned top-left where the case asks bottom-right", None,
              _as_case(_causal_swapped("bottom_right", "top_left"))),
    Diagnosis("causal_bottom_right", "causal masking is aligned bottom-right where the case asks top-left", None,
              _as_case(_causal_swapped("top_left", "bottom_right"))),
    Diagnosis("padding_keys_attended", "zero keys padded up to a block multiple (16, 32, 64 or 128) are attended",
              None, _zero_keys_attended),
    *(Diagnosis(f"computed_in_{d}", f"computed in {d}: within the tolerance of a naive {d} implementation",
                f'compute_dtype = "{d}"', _computed_in(d)) for d in ("float32", "float16", "bfloat16")),
)
BY_NAME = {d.name: d for d in DIAGNOSES}


def explained_by(case: Any, out: np.ndarray | None) -> str | None:
    """The first diagnosis that explains the kernel's output on `case`, if the output fails the spec there."""
    if out is None or not isinstance(case, Case) or getattr(case, "dropout_p", 0.0):
        return None
    out = np.asarray(out, dtype=np.float64)
    if out.shape != case.out_shape or T.judge_output(out, case).ok:
        return None
    for d in DIAGNOSES:
        if d.explains is None:
            continue
        try:
            with np.errstate(all="ignore"):
                if d.explains(case, out):
                    return d.name
        except Exception:      # noqa: BLE001 (a hypothesis that cannot be built explains nothing)
            continue
    return None


def diagnose(case: Any, out: np.ndarray | None, clause: str | None,
             others: Iterable[tuple[Any, np.ndarray]] = ()) -> str:
    """The id of the cause of one failure: the first diagnosis that explains the kernel's output on the
    failing case, else on another call of the same test (a property judged from derived cases, such as
    weights read through one-hot values, fails on the case it was derived from), else
    `unexplained:<clause>`. A failure without an output (an exception, a crash) is explained only by its clause."""
    for d in DIAGNOSES:
        if d.clause is not None and d.clause == clause:
            return d.name
    found = explained_by(case, out)
    for other, other_out in list(others)[-OTHERS:][::-1]:
        if found is not None:
            break
        if other is not case:
            found = explained_by(other, other_out)
    return found or f"{UNEXPLAINED}:{clause or 'ATTN-OP-1'}"


class Keeper:
    """Which failing cases are written as .npz: the first of each cause and the first of each failed clause.
    A later failure of the same clause points at the case already saved for it (same cause if there is one)."""

    def __init__(self) -> None:
        self.by_pair: dict[tuple[str, str], tuple[str, str | None]] = {}
        self.causes: set[str] = set()
        self.clauses: set[str] = set()

    def existing(self, cause: str, clause: str) -> tuple[str, str | None] | None:
        """(failure_file, replay) to reuse, or None when this failure's case is to be saved."""
        if cause not in self.causes or clause not in self.clauses:
            return None
        same = self.by_pair.get((cause, clause))
        if same is not None:
            return same
        return next(v for (c, k), v in self.by_pair.items() if k == clause)

    def keep(self, cause: str, clause: str, path: str, replay: str | None) -> None:
        self.causes.add(cause)
        self.clauses.add(clause)
        self.by_pair.setdefault((cause, clause), (path, replay))


def title_of(cause: str) -> str:
    if cause in BY_NAME:
        return BY_NAME[cause].title
    return f"failures of {cause.split(':', 1)[-1]} that no diagnosis explains"


def group(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run file's `causes`: one entry per cause with the clauses, tests, implementations and dtypes it
    explains, one replayable case, and the declaration that would state it (None where it is a bug)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("status") not in FAILING:
            continue
        cause = r.get("cause") or f"{UNEXPLAINED}:{r.get('failed_clause') or 'ATTN-OP-1'}"
        d = BY_NAME.get(cause)
        g = out.setdefault(cause, {"id": cause, "title": title_of(cause),
                                   "declaration": d.declaration if d else None, "clauses": [], "tests": [],
                                   "implementations": [], "dtypes": [], "failures": 0,
                                   "case": None, "failure_file": None, "replay": None})
        g["failures"] += 1
        for key, value in (("clauses", r.get("failed_clause") or "ATTN-OP-1"), ("tests", r.get("test")),
                           ("implementations", r.get("implementation")), ("dtypes", r.get("dtype") or "any")):
            if value and value not in g[key]:
                g[key].append(value)
        if g["failure_file"] is None and r.get("failure_file"):
            g.update(case=r.get("case"), failure_file=r["failure_file"], replay=r.get("replay"))
    for g in out.values():
        for key in ("clauses", "tests", "implementations", "dtypes"):
            g[key].sort()
    return sorted(out.values(), key=lambda g: (g["id"].startswith(UNEXPLAINED), -len(g["clauses"]), g["id"]))
