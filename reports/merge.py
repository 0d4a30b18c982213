"""Merge run files into one report model that the Markdown, HTML and certificate writers render.

Everything a reader sees is decided here, once: which clauses and columns exist, what state each
matrix cell is in, which implementations agree on the fixed panel. The renderers only format.

Cells come from the run files: each run lists its (implementation, clause, dtype) cells with their
own status and counts (conformance/engine/verdict.py decides them, once). This module only attaches what a
reader drills down to (the records of the cell, the worst error ratio at that dtype) and, for the
per-implementation summary, takes the worst state over an implementation's dtypes:
failing > divergent > below floor > not run > conformant > unsupported.
"""

from __future__ import annotations

import base64
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from attnconf.reports.runfile import RunFileError
from attnconf.spec.vocabulary import ANY_DTYPE, CELL_STATES, DTYPES, FAILING

SPEC_DIR = Path(__file__).resolve().parent.parent / "spec"

_RANK = {state: len(CELL_STATES) - i for i, state in enumerate(CELL_STATES)} | {None: 0}   # worst first
_DTYPE_ORDER = {d: i for i, d in enumerate((*DTYPES, ANY_DTYPE))}


@dataclass(frozen=True)
class Clause:
    id: str
    group: str
    title: str
    statement: str = ""


@dataclass(frozen=True, order=True)
class ImplKey:
    implementation: str
    device: str

    @property
    def label(self) -> str:
        return f"{self.implementation} ({self.device})"


@dataclass(frozen=True, order=True)
class Column:
    impl: ImplKey
    dtype: str


@dataclass
class Cell:
    state: str | None = None
    ratio: float | None = None
    divergences: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    unsupported_reasons: list[str] = field(default_factory=list)
    checked: int = 0
    divergent: int = 0
    first_failure: dict[str, Any] | None = None

    def add(self, state: str, record: dict[str, Any], ratio: float | None) -> None:
        if _RANK[state] > _RANK[self.state]:
            self.state = state
        if ratio is not None:
            self.ratio = worst_ratio(self.ratio, ratio)
        for div in record.get("divergences") or []:
            if div not in self.divergences:
                self.divergences.append(div)
        for reason in record.get("unsupported_reasons") or []:
            if reason not in self.unsupported_reasons:
                self.unsupported_reasons.append(reason)
        if record not in self.records:
            self.records.append(record)

    @property
    def notable_records(self) -> list[dict[str, Any]]:
        """The records a reader drills down to: failing first, then divergent ones."""
        bad = [r for r in self.records if r["status"] in FAILING]
        div = [r for r in self.records if r not in bad and (r["status"] == "divergent" or r.get("divergences"))]
        return bad + div


@dataclass
class PanelPair:
    a: ImplKey
    b: ImplKey
    agree: int
    total: int
    disagreements: list[dict[str, Any]]

    @property
    def agrees(self) -> bool:
        return self.total > 0 and self.agree == self.total


@dataclass
class Report:
    runs: list[dict[str, Any]]
    clauses: list[Clause]
    columns: list[Column]
    cells: dict[tuple[str, Column], Cell]
    impl_cells: dict[tuple[str, ImplKey], Cell]
    pairs: list[PanelPair]
    divergences: list[dict[str, Any]]
    observations: list[dict[str, Any]]
    samples: list[dict[str, Any]]

    @property
    def impls(self) -> list[ImplKey]:
        return sorted({c.impl for c in self.columns})

    @property
    def groups(self) -> list[tuple[str, list[Clause]]]:
        out: dict[str, list[Clause]] = {}
        for clause in self.clauses:
            out.setdefault(clause.group, []).append(clause)
        return list(out.items())

    def backend_of(self, impl: ImplKey) -> str:
        return impl.implementation.split(":", 1)[0]


def worst_ratio(a: float | None, b: float | None) -> float | None:
    """The larger ratio; NaN (an implementation returned NaN) counts as the worst."""
    if a is None:
        return b
    if b is None:
        return a
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def record_state(record: dict[str, Any]) -> str:
    status = record["status"]
    if status in FAILING:
        return "failing"
    if status == "divergent" or record.get("divergences"):
        return "divergent"
    if status in ("unsupported", "not_requested"):
        return "unsupported"
    if status == "not_run":
        return "not_run"
    return "conformant"


def load_clauses(spec_dir: Path = SPEC_DIR) -> list[Clause]:
    path = spec_dir / "clauses.toml"
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [
        Clause(c["id"], c.get("group", "other"), c.get("title", c["id"]), c.get("statement", ""))
        for c in data.get("clause", [])
    ]


def load_divergence_entries(spec_dir: Path = SPEC_DIR) -> dict[str, dict[str, Any]]:
    """Divergence entries of every registered backend pack's divergences.toml (and of any
    `<spec_dir>/divergences/*.toml`), by id (titles, links, versions)."""
    from attnconf.adapters.registry import REGISTRY, divergences_file

    out: dict[str, dict[str, Any]] = {}
    packs = [p for b in REGISTRY if (p := divergences_file(b))]
    for path in [*sorted((spec_dir / "divergences").glob("*.toml")), *packs]:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            continue  # the spec tests report a broken file; the report still renders
        for entry in data.get("divergence", []):
            if "id" in entry:
                out[entry["id"]] = {**entry, "file": _shown(path)}
    return out


def _shown(path: Path) -> str:
    """A data file's path as reports show it: relative to the checkout or the installed package."""
    root = SPEC_DIR.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


def _impl_key(run: dict[str, Any], implementation: str | None) -> ImplKey:
    env = run["environment"]
    return ImplKey(implementation or f"{env['backend']}:(all)", env["device"])


def decode_panel_output(entry: dict[str, Any], source: str) -> np.ndarray:
    shape = tuple(int(n) for n in entry["shape"])
    try:
        raw = base64.b64decode(entry["out_b64"], validate=True)
    except ValueError:
        raise RunFileError(f"{source}: panel case {entry['case']!r}: out_b64 is not base64") from None
    if len(raw) != 8 * math.prod(shape):
        raise RunFileError(
            f"{source}: panel case {entry['case']!r}: {len(raw)} bytes do not hold float64 {list(shape)}"
        )
    return np.frombuffer(raw, dtype="<f8").reshape(shape)


def panel_agreement(
    out_a: np.ndarray, allow_a: float, out_b: np.ndarray, allow_b: float
) -> tuple[bool, str]:
    """Agree iff max|a - b| <= allow_a + allow_b; NaN agrees only with NaN at the same place."""
    if out_a.shape != out_b.shape:
        return False, f"shapes {list(out_a.shape)} vs {list(out_b.shape)}"
    nan_a, nan_b = np.isnan(out_a), np.isnan(out_b)
    if (nan_a != nan_b).any():
        return False, f"NaN at {int((nan_a != nan_b).sum())} position(s) in only one output"
    bound = allow_a + allow_b
    same = (out_a == out_b) | nan_a
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(out_a - out_b))
    worst = float(diff.max()) if diff.size else 0.0
    ok = not math.isnan(bound) and worst <= bound
    return ok, f"max|diff| {worst:.3g} vs allowance {bound:.3g}"


def _pairs(runs: list[dict[str, Any]], sources: list[str]) -> list[PanelPair]:
    outputs: dict[ImplKey, dict[str, tuple[np.ndarray, float, str]]] = {}
    for run, source in zip(runs, sources):
        for implementation, entries in (run.get("panel") or {}).items():
            per_case = outputs.setdefault(_impl_key(run, implementation), {})
            for entry in entries:
                if entry["status"] == "ran":
                    out = decode_panel_output(entry, source)
                    per_case[entry["case"]] = (out, float(entry["allowance"]), entry.get("description", ""))
    pairs = []
    for a, b in itertools.combinations(sorted(outputs), 2):
        shared = sorted(set(outputs[a]) & set(outputs[b]))
        agree, bad = 0, []
        for case in shared:
            out_a, allow_a, description = outputs[a][case]
            out_b, allow_b, _ = outputs[b][case]
            ok, detail = panel_agreement(out_a, allow_a, out_b, allow_b)
            if ok:
                agree += 1
            else:
                bad.append({"case": case, "description": description, "detail": detail})
        pairs.append(PanelPair(a, b, agree, len(shared), bad))
    return pairs


def build(
    runs: Iterable[dict[str, Any]],
    sources: Iterable[str] | None = None,
    spec_dir: Path = SPEC_DIR,
) -> Report:
    """Build the report model from loaded (validated) run files."""
    runs = list(runs)
    sources = list(sources) if sources is not None else [r["run_id"] for r in runs]
    seen: dict[str, str] = {}
    for run, source in zip(runs, sources):
        if run["run_id"] in seen:
            raise RunFileError(f"{source}: run_id {run['run_id']!r} also in {seen[run['run_id']]}")
        seen[run["run_id"]] = source

    clauses = load_clauses(spec_dir)
    known = {c.id for c in clauses}
    for run in runs:
        for cid in [c["clause"] for c in run.get("cells") or []] + [c for r in run["records"] for c in r["clauses"]]:
            if cid not in known:
                known.add(cid)
                clauses.append(Clause(cid, "not in spec/clauses.toml", cid))

    cells: dict[tuple[str, Column], Cell] = {}
    impl_cells: dict[tuple[str, ImplKey], Cell] = {}
    samples: list[dict[str, Any]] = []
    for run in runs:
        device = run["environment"]["device"]
        by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rec in run["records"]:
            rec = {**rec, "run_id": run["run_id"]}
            impl = rec["implementation"] or "-"
            for cid in rec["clauses"]:
                by_cell.setdefault((impl, cid), []).append(rec)
            for sample in rec.get("samples") or []:
                samples.append({**sample, "impl": _impl_key(run, rec["implementation"]).label})
        for c in run.get("cells") or []:
            key = ImplKey(c["implementation"], device)
            col = Column(key, c["dtype"])
            recs = [r for r in by_cell.get((c["implementation"], c["clause"]), [])
                    if (r.get("dtype") or ANY_DTYPE) == c["dtype"]
                    or (r.get("dtype") is None and c["dtype"] in (r.get("ratios") or {}))]
            ratio = None
            for r in recs:
                stats = (r.get("ratios") or {}).get(c["dtype"]) if c["dtype"] != ANY_DTYPE else None
                if stats is not None:
                    ratio = worst_ratio(ratio, stats.get("max"))
            cell = Cell(state=c["status"], ratio=ratio, divergences=list(c.get("divergences") or []), records=recs,
                        unsupported_reasons=list(c.get("unsupported_reasons") or []), checked=c.get("checked", 0),
                        divergent=c.get("divergent", 0), first_failure=c.get("first_failure"))
            cells[(c["clause"], col)] = cell
            summary = impl_cells.setdefault((c["clause"], key), Cell())
            if _RANK[cell.state] > _RANK[summary.state]:
                summary.state = cell.state
            summary.ratio = worst_ratio(summary.ratio, ratio)
            summary.checked += cell.checked
            summary.divergent += cell.divergent
            for d in cell.divergences:
                if d not in summary.divergences:
                    summary.divergences.append(d)
            for r in recs:
                if r not in summary.records:
                    summary.records.append(r)
    columns = sorted({col for (_, col) in cells}, key=lambda c: (c.impl, _DTYPE_ORDER.get(c.dtype, 9), c.dtype))

    entries = load_divergence_entries(spec_dir)
    divergences: dict[str, dict[str, Any]] = {}
    for run in runs:
        for div in run.get("divergences") or []:
            merged = divergences.setdefault(div["id"], {**entries.get(div["id"], {}), **div, "runs": []})
            merged["runs"].append(
                {"run_id": run["run_id"], "observed": div.get("observed"), "witness": div.get("witness_status"),
                 "detail": div.get("witness_detail", ""), "holds": div.get("holds", True),
                 "condition": div.get("condition", "")}
            )
    for cell in cells.values():
        for div in cell.divergences:
            if div not in divergences:
                divergences[div] = {"id": div, **entries.get(div, {}), "runs": []}

    observations = []
    for run in runs:
        for obs in run.get("observations") or []:
            observations.append({**obs, "device": run["environment"]["device"], "run_id": run["run_id"]})

    return Report(
        runs=runs,
        clauses=clauses,
        columns=columns,
        cells=cells,
        impl_cells=impl_cells,
        pairs=_pairs(runs, sources),
        divergences=sorted(divergences.values(), key=lambda d: d["id"]),
        observations=observations,
        samples=samples,
    )


def format_ratio(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return f"{value:.2f}" if value < 100 else f"{value:.3g}"


def environment_rows(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) pairs describing a run's environment, in reading order."""
    env = run["environment"]
    rows = [
        ("run", run["run_id"]),
        ("created", run["created"]),
        ("backend / device", f"{env['backend']} / {env['device']}"),
        ("device name", str(env.get("device_name") or "")),
        ("compute capability", str(env.get("compute_capability") or "")),
        ("kernel", str(env.get("kernel") or "")),
        ("frameworks", ", ".join(f"{k} {v}" for k, v in (env.get("frameworks") or {}).items())),
        ("python", str(env.get("python", ""))),
        ("platform", str(env.get("platform", ""))),
        ("precision flags", ", ".join(f"{k}={v}" for k, v in (env.get("precision_flags") or {}).items())),
        ("hypothesis", ", ".join(f"{k}={v}" for k, v in (env.get("hypothesis") or {}).items())),
        ("suite version", str(env.get("suite_version", ""))),
        ("git revision", str(env.get("git_revision") or "")),
        ("spec hash", str(env.get("spec_hash", ""))[:16]),
        ("implementations", ", ".join((env.get("implementations") or {}).keys())),
    ]
    return [(k, v) for k, v in rows if v]
