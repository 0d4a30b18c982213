"""What a run and each test item keep: the run's `Session`, a test item's `TestRecord`, and the `Subject`
that binds an adapter to both.

The plugin builds the Session once (on `config.stash`) and one TestRecord per item; the harness fills the
record as examples run (checked, unsupported, divergent, error ratios, observations), and the plugin turns
it into the item's run-file record. Nothing here calls a kernel or judges a result.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnconf.adapters import Adapter
from attnconf.conformance.engine import tolerance
from attnconf.reference import Case

MAX_SAMPLES = 100
KEEP_OUTPUTS = 32              # kernel outputs a record keeps for diagnosing its failure (TestRecord.outputs)


@dataclass
class Session:
    """The run's state, built once by the plugin and kept on `config.stash`."""

    backend: str
    impls: list
    divergences: Any                          # conformance.divergences.Divergences
    device: str = "cpu"
    replay: Case | None = None
    long: bool = False
    measure_memory: bool = False
    seed: int | None = None                   # --hypothesis-seed: reseeds even the derandomized ci profile
    case_timeout: float = 60.0                # seconds per kernel call (in-process: SIGALRM; isolated: worker)
    max_timeouts: int = 2                     # after this many timeouts an implementation's calls are skipped
    deadline: float | None = None             # time.time() after which no further test starts (--run-timeout)
    timeouts: dict[str, int] = field(default_factory=dict)
    entries: list = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    # (implementation, clause, dtype) -> examples that checked it so far in cells sharing the floor (cell_minimum)
    floor_checked: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline


@dataclass
class TestRecord:
    """What one test item (test x implementation x dtype cell) saw."""

    nodeid: str
    test: str
    clauses: list[str]
    implementation: str
    dtype: str | None = None
    examples: int = 0                         # calls of the test body (Hypothesis examples, shrinking included)
    checked: int = 0                          # examples in which the kernel ran and was judged
    unsupported: int = 0
    unsupported_reasons: set[str] = field(default_factory=set)
    divergent: int = 0                        # examples in which a declared divergence covered some elements
    divergences: set[str] = field(default_factory=set)
    divergent_by_entry: dict[str, int] = field(default_factory=dict)
    conformed_in_region: dict[str, int] = field(default_factory=dict)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    panel: list[dict[str, Any]] = field(default_factory=list)
    current_case: Case | None = None
    rejected: int = 0                         # unjudged examples handed back to Hypothesis for another draw
    # the latest calls' (case, raw output): Hypothesis re-runs each failing example at the end, and the failure
    # it reports may be an earlier one than the last example run (conformance/engine/causes.py diagnoses it)
    outputs: deque = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))
    # "+"-joined features of the cases a judged example ran ("grads", "dbias" too) -> examples (verdict.credited)
    checked_features: dict[str, int] = field(default_factory=dict)
    _example: dict[str, Any] = field(default_factory=dict)

    def begin_example(self, case) -> None:
        self.examples += 1
        self.current_case = case
        self._example = {"ran": False, "unsupported": False, "entries": set()}

    def end_example(self) -> bool:
        """Close the example; whether the kernel ran on it and its results were judged."""
        ex = self._example
        if ex.get("ran"):
            self.checked += 1
            if "features" in ex:
                sig = "+".join(sorted(ex["features"]))
                self.checked_features[sig] = self.checked_features.get(sig, 0) + 1
        elif ex.get("unsupported"):
            self.unsupported += 1
        if ex.get("entries"):
            self.divergent += 1
            for eid in ex["entries"]:
                self.divergent_by_entry[eid] = self.divergent_by_entry.get(eid, 0) + 1
        self._example = {}
        return bool(ex.get("ran"))

    def output_of(self, case) -> np.ndarray | None:
        """The kernel's latest raw output on `case` (the very object), if still kept."""
        return next((out for c, out in reversed(self.outputs) if c is case), None)

    def note_unsupported(self, reason: str) -> None:
        self.unsupported_reasons.add(reason)
        if self._example:
            self._example["unsupported"] = True
        else:
            self.unsupported += 1

    def note_features(self, case: Any, grads: bool) -> None:
        """What a judged call of this example exercised: the case's features, and gradients if they were asked."""
        if not self._example or not hasattr(case, "features"):
            return
        f = set(case.features()) | ({"grads"} | ({"dbias"} if case.bias is not None else set()) if grads else set())
        self._example["features"] = self._example.get("features", set()) | f

    def note_ran(self) -> None:
        if self._example:
            self._example["ran"] = True
        else:
            self.checked += 1

    def note_divergent(self, entry_id: str) -> None:
        self.divergences.add(entry_id)
        if self._example:
            self._example["entries"].add(entry_id)
        else:
            self.divergent += 1
            self.divergent_by_entry[entry_id] = self.divergent_by_entry.get(entry_id, 0) + 1

    def note_conformed_in_region(self, entry_id: str) -> None:
        """An entry's covered elements conformed to the spec itself on this call: nothing diverged there."""
        self.conformed_in_region[entry_id] = self.conformed_in_region.get(entry_id, 0) + 1

    def add_judgement(self, j: tolerance.Judgement, case: Case) -> None:
        """Keep the judgement's error ratios; a non-finite one (NaN or inf where the reference is finite) is
        the worst there is and is kept too, so a summary never shows a small worst ratio beside such failures."""
        r = self.ratios.setdefault(j.dtype, {"max": 0.0, "mean": 0.0, "cases": 0})
        r["max"] = worst(r["max"], j.ratio_max)
        r["mean"] = worst(r["mean"], j.ratio_mean)
        r["cases"] += 1
        if not np.isfinite(j.ratio_max):
            return
        if len(self.samples) < MAX_SAMPLES and hasattr(case, "shape"):
            s = case.shape
            self.samples.append({"dtype": j.dtype, "quantity": j.quantity, "Lq": s["Lq"], "Lk": s["Lk"], "Dk": s["Dk"],
                                 "ratio_max": j.ratio_max, "ratio_mean": j.ratio_mean})


def worst(a: float, b: float) -> float:
    """The larger of two error ratios, NaN counting as the worst."""
    return float("nan") if np.isnan(a) or np.isnan(b) else max(a, b)


class Subject:
    """The implementation under test as a test sees it: the adapter, bound to its record and session.

    Attribute access falls through to the adapter (`impl.name`, `impl.capabilities`, ...)."""

    def __init__(self, adapter: Adapter, record: TestRecord, session: Session):
        self.adapter, self.record, self.session = adapter, record, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)

    def __repr__(self) -> str:
        return f"<Subject {self.adapter.name} for {self.record.test}>"


def parts(impl: Subject | Adapter) -> tuple[Adapter, TestRecord, Session]:
    """(adapter, record, session) of a Subject; anything else means the harness runs outside the plugin."""
    if not isinstance(impl, Subject):
        raise RuntimeError("conformance harness used outside a test run by the attnconf plugin "
                           f"(got {type(impl).__name__}, not a Subject)")
    return impl.adapter, impl.record, impl.session


def name_of(impl: Subject | Adapter | str) -> str:
    return impl if isinstance(impl, str) else impl.name


def observe(impl: Subject, clause: str, key: str, value: Any, case: Case | None = None) -> None:
    """Record a behaviour for the report (ATTN-NAN-*, ATTN-OP-7): a report row, not a verdict."""
    rec = impl.record
    rec.observations.append({"clause": clause, "implementation": rec.implementation, "key": key,
                             "value": value, "case": case.summary() if case is not None else None})


def record_panel(impl: Subject, entry: dict[str, Any]) -> None:
    impl.record.panel.append(entry)
