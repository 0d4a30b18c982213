"""Keep divergence entries honest where they hold: fail on a stale entry (`make test`, after the suites).

    python -m attnconf.conformance.entries_check RUN.json [RUN.json ...]

A stale entry (its witness conforms now) never changes a kernel's verdict: the implementation got
better. But the project's own divergence files must not keep it, so this check, run by `make test` on
the run files of the ci suites, fails on every entry that holds on this machine and is stale, and on
every entry whose witness behaves neither as the spec nor as the entry says. Entries whose conditions
exclude this machine are listed, not judged.
"""
from __future__ import annotations

import argparse
import sys

from attnconf.reports.runfile import RunFileError, load


def problems(run: dict) -> tuple[list[str], list[str]]:
    """(problems, notes) of one run file."""
    bad, notes = [], []
    for d in run.get("divergences") or []:
        status = str(d.get("witness_status", "not run"))
        if not d.get("holds", True):
            notes.append(f"{d['id']}: inactive here ({d.get('condition', '')})")
        elif status.startswith("stale"):
            bad.append(f"{d['id']}: stale here (its witness conforms: {d.get('witness_detail', '')}); "
                       f"narrow or remove the entry, or state the conditions under which it holds")
        elif status == "other":
            bad.append(f"{d['id']}: its witness behaves neither as the spec nor as the entry says "
                       f"({d.get('witness_detail', '')})")
    return bad, notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    args = p.parse_args(argv)
    failed = False
    for path in args.runs:
        try:
            run = load(path)
        except RunFileError as exc:
            print(f"entries_check: {exc}", file=sys.stderr)
            return 2
        bad, notes = problems(run)
        for n in notes:
            print(f"{path}: {n}")
        for b in bad:
            print(f"{path}: {b}")
        failed |= bool(bad)
    if not failed:
        print("entries_check: every entry that holds here diverges as declared")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
