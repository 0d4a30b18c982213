"""Command line: `python -m reports merge --out DIR RUN.json...` and `python -m reports validate RUN.json...`.

Exit status: 0 done, 2 a run file was unreadable, of an unknown schema version, or invalid
(one line on stderr naming the file and the problem).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnconf.reports import certificate, html, markdown, merge
from attnconf.reports.runfile import RunFileError, load


def _merge(args: argparse.Namespace) -> int:
    runs = [load(p) for p in args.runs]
    spec_dir = Path(args.spec) if args.spec else merge.SPEC_DIR
    report = merge.build(runs, [str(p) for p in args.runs], spec_dir=spec_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(markdown.render(report), encoding="utf-8")
    (out / "index.html").write_text(html.render(report), encoding="utf-8")
    written = [out / "README.md", out / "index.html"]
    clauses = merge.load_clauses(spec_dir)
    used: set[str] = set()
    for run in runs:
        if run["environment"].get("kernel"):
            name = certificate.slug(run)
            if name in used:
                name = f"{name}-{run['run_id']}"
            used.add(name)
            written += certificate.write(run, out, clauses, name)
    for path in written:
        print(path)
    return 0


def _validate(args: argparse.Namespace) -> int:
    for path in args.runs:
        load(path)
        print(f"{path}: valid")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports", description="attnconf run files to reports")
    sub = parser.add_subparsers(dest="command", required=True)
    p_merge = sub.add_parser("merge", help="merge run files into README.md, index.html and certificates")
    p_merge.add_argument("--out", required=True, help="output folder")
    p_merge.add_argument("--spec", help="spec folder (default: the checkout's spec/)")
    p_merge.add_argument("runs", nargs="+", help="run JSON files")
    p_merge.set_defaults(func=_merge)
    p_val = sub.add_parser("validate", help="check run files against reports/schema.json")
    p_val.add_argument("runs", nargs="+", help="run JSON files")
    p_val.set_defaults(func=_validate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RunFileError as exc:
        print(f"python -m reports: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
