"""Re-check saved failing cases by hand: run each `.npz` through the kernel once and compare
with the float64 oracle, split by rows that see no key (empty) and rows that see some.

    PYTHONPATH=<site> python -m attnconf.reports.real.recheck --kernel MODULE:FN \
        [--capabilities FILE.toml] [--convention NAME] CASE.npz ...

One line per case: the test it came from, the case's features, the largest error in rows that
see at least one key against the dtype's emulated baseline error there, and the same for
empty rows. A failure whose error sits only in empty rows is the empty-row behaviour; one with
an error far past the baseline in rows that see keys is something else, to look at by hand.
This is a diagnosis aid for the wrappers under reports/real/, not part of the suite.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from attnconf.adapters import load
from attnconf.reference import Case, baseline_error, oracle


def _split(err: np.ndarray, empty: np.ndarray) -> tuple[float, float]:
    rows = err.max(axis=-1)
    seen = rows[~empty]
    return (float(seen.max()) if seen.size else 0.0), (float(rows[empty].max()) if empty.any() else 0.0)


def recheck(adapter, path: Path) -> str:
    case = Case.load(path)
    test = path.name.split("-")[0]
    try:
        got = adapter.run(case).out
    except Exception as exc:  # the kernel's own error is the finding here
        return f"{test}: raises {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    ref = oracle(case)
    empty = ~ref.visible.any(axis=-1)
    with np.errstate(all="ignore"):
        err = np.where(np.isnan(got), np.inf, np.abs(got - ref.out))
    base = np.zeros_like(err) if case.dtype == "float64" else baseline_error(case)[0]
    seen_err, empty_err = _split(err, empty)
    seen_base, _ = _split(base, empty)
    feats = ",".join(sorted(case.features())) or "plain"
    s = case.shape
    return (f"{test}: {case.dtype} B{s['B']} H{s['Hq']}/{s['Hkv']} L{s['Lq']}x{s['Lk']} D{s['Dk']} "
            f"scale={case.scale} [{feats}] seen-rows err {seen_err:.3g} (baseline {seen_base:.3g}); "
            f"empty rows {int(empty.sum())} err {empty_err:.3g}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", required=True)
    p.add_argument("--capabilities")
    p.add_argument("--convention")
    p.add_argument("cases", nargs="+", type=Path)
    a = p.parse_args(argv)
    adapter = load("torch", kernel=a.kernel, capabilities=a.capabilities, convention=a.convention)[0]
    for path in a.cases:
        print(recheck(adapter, path), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
