"""Merge run files into one report model that the Markdown, HTML and certificate writers render.

Everything a reader sees is decided here, once: which clauses and columns exist, what state each
matrix cell is in, which implementations agree on the fixed panel. The renderers only format.

Cell rule: a record citing clause C for implementation I contributes to the dtype columns named by
its `ratios`; a record without ratios contributes to every dtype column of I. A failing record is
failing in the dtypes it can be blamed on (ratio > 1 or NaN, or the dtype its failing case names)
and conformant in its other ratio dtypes; when nothing tells, it fails every dtype column of I.
The worst state wins:
failing > divergent > conformant > unsupported > not run.
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

SPEC_DIR = Path(__file__).resolve().parent.parent / "spec"

FAILING = ("fail", "error", "crashed", "timeout")
STATES = ("failing", "divergent", "conformant", "unsupported")
_RANK = {"failing": 4, "divergent": 3, "conformant": 2, "unsupported": 1, None: 0}
ANY_DTYPE = "any"


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
    if status == "unsupported":
        return "unsupported"
    return "conformant"


def _failing_dtypes(record: dict[str, Any], columns: list[Column]) -> set[str]:
    """The dtypes a failing record can be blamed on: those whose worst ratio exceeds 1 (or is NaN)
    and those its failing case names. Empty when neither tells, and then every dtype is failing."""
    blamed = set()
    for dtype, stats in (record.get("ratios") or {}).items():
        worst = stats.get("max")
        if worst is not None and (math.isnan(worst) or worst > 1):
            blamed.add(dtype)
    words = set(re.findall(r"[a-z0-9_]+", record.get("case") or ""))
    blamed |= {c.dtype for c in columns if c.dtype in words}
    return blamed


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
    """Divergence entries from spec/divergences/*.toml, by id (titles, links, versions)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((spec_dir / "divergences").glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            continue  # the spec tests report a broken file; the report still renders
        for entry in data.get("divergence", []):
            if "id" in entry:
                out[entry["id"]] = {**entry, "file": f"spec/divergences/{path.name}"}
    return out


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
        for rec in run["records"]:
            for cid in rec["clauses"]:
                if cid not in known:
                    known.add(cid)
                    clauses.append(Clause(cid, "not in spec/clauses.toml", cid))

    dtypes: dict[ImplKey, set[str]] = {}
    for run in runs:
        for rec in run["records"]:
            key = _impl_key(run, rec["implementation"])
            dtypes.setdefault(key, set()).update((rec.get("ratios") or {}).keys())
    columns = sorted(
        Column(impl, dt) for impl, found in dtypes.items() for dt in (sorted(found) or [ANY_DTYPE])
    )
    by_impl: dict[ImplKey, list[Column]] = {}
    for col in columns:
        by_impl.setdefault(col.impl, []).append(col)

    cells: dict[tuple[str, Column], Cell] = {}
    impl_cells: dict[tuple[str, ImplKey], Cell] = {}
    samples: list[dict[str, Any]] = []
    for run in runs:
        for rec in run["records"]:
            rec = {**rec, "run_id": run["run_id"]}
            key = _impl_key(run, rec["implementation"])
            state = record_state(rec)
            ratios = rec.get("ratios") or {}
            targets = by_impl[key]
            if ratios:
                targets = [c for c in targets if c.dtype in ratios]
            blamed = _failing_dtypes(rec, by_impl[key]) if state == "failing" else set()
            if blamed:
                targets = [c for c in by_impl[key] if c.dtype in blamed or c.dtype in ratios]
            elif state == "failing":
                targets = by_impl[key]
            for cid in rec["clauses"]:
                for col in targets:
                    r = ratios.get(col.dtype, {}).get("max") if ratios else None
                    col_state = "conformant" if blamed and col.dtype not in blamed else state
                    cells.setdefault((cid, col), Cell()).add(col_state, rec, r)
                overall = None
                for stats in ratios.values():
                    overall = worst_ratio(overall, stats.get("max"))
                impl_cells.setdefault((cid, key), Cell()).add(state, rec, overall)
            for sample in rec.get("samples") or []:
                samples.append({**sample, "impl": key.label})

    entries = load_divergence_entries(spec_dir)
    divergences: dict[str, dict[str, Any]] = {}
    for run in runs:
        for div in run.get("divergences") or []:
            merged = divergences.setdefault(div["id"], {**entries.get(div["id"], {}), **div, "runs": []})
            merged["runs"].append(
                {"run_id": run["run_id"], "observed": div.get("observed"), "witness": div.get("witness")}
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
