"""The `attnconf` command (also `python -m attnconf`).

    attnconf certify --backend torch [--kernel MODULE:ATTR | --impl NAME,...] [--convention NAME] [--device D]
                     [--capabilities FILE.toml] [--profile ci] [--out DIR] [--isolate] [-- PYTEST ARGS]
    attnconf report RUN.json... --out DIR
    attnconf replay FILE.npz [--backend B [--kernel MODULE:ATTR] [--capabilities FILE.toml] [--divergences-dir DIR]
                    [--test NODEID|EXPR]]   (default test: the one that saved FILE)
    attnconf backends [--names] [--json] [--matrix] [--installed] [--devices cpu,...]

`certify` and `replay` run the suite that ships with attnconf (the installed `attnconf/conformance`
folder, or the checkout's `conformance/`) in a pytest subprocess isolated from the calling
repository: attnconf's own ini file (`-c`), the suite folder as rootdir, no cache, no
PYTEST_ADDOPTS, and no auto-loaded pytest plugins (only attnconf's and Hypothesis' are loaded),
so the caller's pytest.ini / pyproject.toml / conftest.py / plugins never change a certification.
The kernel is imported from the current directory and PYTHONPATH.

Exit status of `certify`: 0 for CONFORMANT or CONFORMANT_WITH_DIVERGENCES (and pytest exiting 0);
1 for any other verdict (NONCONFORMANT, INCOMPLETE, ...); 2 when no run file was written (a usage
error the suite reported, or a crash) or the run file is invalid.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

PASSING = ("CONFORMANT", "CONFORMANT_WITH_DIVERGENCES")
PROG = "attnconf"


class CliError(Exception):
    """A mistake on the command line or in the environment; printed as one line, exit 2."""


# ---- running the suite in isolation -------------------------------------------

def suite_dir() -> Path:
    """The conformance folder that ships with this attnconf."""
    import attnconf.conformance

    return Path(attnconf.conformance.__file__).resolve().parent


def suite_ini() -> Path:
    return suite_dir() / "pytest-attnconf.ini"


def hypothesis_plugins() -> list[str]:
    """Hypothesis' pytest plugin module(s), from its pytest11 entry point (autoload is off in the subprocess)."""
    mods = [ep.value for ep in importlib.metadata.entry_points(group="pytest11")
            if ep.dist is not None and ep.dist.name.lower() == "hypothesis"]
    if not mods:
        raise CliError("Hypothesis' pytest plugin is not installed; install attnconf's dependencies: pip install attnconf")
    return mods


def suite_command(pytest_args: Sequence[str], target: str | None = None) -> list[str]:
    """`python -m pytest` on the shipped suite (or one node of it) with attnconf's own configuration."""
    folder = suite_dir()
    plugins = ["attnconf.conformance.engine.plugin", *hypothesis_plugins()]
    return [sys.executable, "-m", "pytest", target or str(folder), "-c", str(suite_ini()), "--rootdir", str(folder),
            "-p", "no:cacheprovider", *(a for p in plugins for a in ("-p", p)), *pytest_args]


def suite_env(cwd: Path) -> dict[str, str]:
    """The caller's environment minus what would configure pytest; the caller's folder importable. attnconf
    (a wheel, or a checkout's editable install) is found in site-packages by the same interpreter;
    site-packages is never put on PYTHONPATH (it would precede the stdlib)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_suite(pytest_args: Sequence[str], target: str | None = None) -> int:
    """The suite in a subprocess from the caller's folder; Hypothesis' storage (`.hypothesis/`) goes to a
    temporary folder removed afterwards, never into the caller's repository."""
    import tempfile

    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="attnconf-hypothesis-") as storage:
        env = {**suite_env(cwd), "HYPOTHESIS_STORAGE_DIRECTORY": storage}
        return subprocess.run(suite_command(pytest_args, target), cwd=cwd, env=env).returncode


def _backend_args(args: argparse.Namespace) -> list[str]:
    out = [f"--backend={args.backend}", f"--device={args.device}"]
    for opt in ("kernel", "convention", "capabilities", "impl", "divergences_dir"):
        value = getattr(args, opt, None)
        if value:
            out.append(f"--{opt.replace('_', '-')}={value}")
    if getattr(args, "isolate", False):
        out.append("--isolate")
    return out


def _check_backend(name: str) -> None:
    from attnconf.adapters.registry import REGISTRY

    if name not in REGISTRY:
        raise CliError(f"unknown backend {name!r}; known: {', '.join(REGISTRY)} (see: attnconf backends)")
    decl = REGISTRY[name]
    if not decl.installed():
        raise CliError(f"backend {name!r}: {decl.status()}; {decl.remedy()}")


# ---- certify ----------------------------------------------------------------------

def verdict_line(verdict: dict[str, Any]) -> str:
    v = verdict.get("verdict", "?")
    if verdict.get("divergences") and v == "CONFORMANT_WITH_DIVERGENCES":
        return f"{v}[{', '.join(verdict['divergences'])}]"
    if verdict.get("failed_clauses"):
        return f"{v} (failed clauses: {', '.join(verdict['failed_clauses'])})"
    return v


def certify(args: argparse.Namespace) -> int:
    _check_backend(args.backend)
    if args.kernel and args.impl:
        raise CliError("--impl chooses among the backend's own implementations; it cannot be combined with --kernel")
    if args.capabilities and not Path(args.capabilities).is_file():
        raise CliError(f"--capabilities {args.capabilities}: no such file")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_path, md_path, json_path = out / "run.json", out / "certificate.md", out / "certificate.json"
    for stale in (run_path, md_path, json_path, md_path.with_suffix(".svg")):   # a failed run must never leave an old verdict behind
        stale.unlink(missing_ok=True)
    pytest_args = [*_backend_args(args), f"--hypothesis-profile={args.profile}", f"--report={run_path.resolve()}",
                   f"--failures-dir={(out / 'failures').resolve()}", "-q", *args.pytest_args]
    if args.seed is not None:
        pytest_args.append(f"--hypothesis-seed={args.seed}")
    code = run_suite(pytest_args)
    if not run_path.exists():
        print(f"{PROG} certify: the suite wrote no run file (pytest exit {code}); see the error above", file=sys.stderr)
        return 2
    from attnconf.reports import certificate
    from attnconf.reports.runfile import RunFileError, load

    try:
        run = load(run_path)
    except RunFileError as exc:
        print(f"{PROG} certify: {exc}", file=sys.stderr)
        return 2
    certificate.write_files(run, md_path, json_path)
    verdict = run["verdict"]
    print(f"verdict: {verdict_line(verdict)}")
    print(f"certificate: {md_path} (JSON: {json_path}, badge: {md_path.with_suffix('.svg')}); run file: {run_path}")
    if verdict["verdict"] in PASSING and code == 0:
        return 0
    if verdict["verdict"] in PASSING:
        print(f"{PROG} certify: pytest exited {code} although the verdict is {verdict['verdict']}: not certified",
              file=sys.stderr)
    return 1


# ---- report -------------------------------------------------------------------------

def report(args: argparse.Namespace) -> int:
    from attnconf.reports.__main__ import main as reports_main

    argv = ["merge", "--out", args.out, *(["--spec", args.spec] if args.spec else []), *args.runs]
    return reports_main(argv)


# ---- replay -------------------------------------------------------------------------

def replay(args: argparse.Namespace) -> int:
    path = Path(args.case)
    if not path.is_file():
        raise CliError(f"{args.case}: no such file")
    from attnconf.reference import Case

    try:
        case = Case.load(path)
    except Exception as exc:
        raise CliError(f"{args.case}: cannot load the case: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    print(f"case: {case.summary()}")
    if not args.backend:
        print(f"replay it with: {PROG} replay {path} --backend BACKEND [--kernel MODULE:ATTR | --impl NAME]")
        return 0
    _check_backend(args.backend)
    pytest_args = [*_backend_args(args), f"--replay={path.resolve()}", f"--failures-dir={path.resolve().parent}",
                   "-q", *args.pytest_args]
    test = args.test or saved_by(path)
    if test is None:
        raise CliError(f"cannot tell which test saved {path.name}; give --test NODEID (the failure's replay line has it)")
    if "::" in test:   # a node id, as a failure's replay line prints it
        file, _, rest = test.partition("::")
        return run_suite(pytest_args, target=f"{suite_dir() / Path(file).name}::{rest}")
    return run_suite(pytest_args + ["-k", test])


def saved_by(path: Path) -> str | None:
    """The test that saved a failing case: the plugin names the file `<test name>[-<impl>]-<digest>.npz`."""
    name = path.stem.split("-", 1)[0]
    if not name.startswith("test_"):
        return None
    for file in sorted(suite_dir().glob("test_*.py")):
        if re.search(rf"^def {re.escape(name)}\(", file.read_text(encoding="utf-8"), re.M):
            return f"{file.name}::{name}"
    return None


# ---- backends -----------------------------------------------------------------------

def backends(args: argparse.Namespace) -> int:
    from attnconf.adapters.registry import REGISTRY

    decls = [REGISTRY[n] for n in REGISTRY]
    if args.installed:
        decls = [d for d in decls if d.installed()]
    elif args.names or args.matrix:
        decls = [d for d in decls if d.adapter_present() and not d.note]   # what this attnconf can run
    if args.matrix:
        wanted = [d.strip() for d in args.devices.split(",")] if args.devices else None
        include = [{"backend": d.name, "device": dev} for d in decls for dev in (d.devices or ("cpu",))
                   if wanted is None or dev in wanted]
        print(json.dumps({"include": include}))
        return 0
    if args.names:
        names = [d.name for d in decls]
        print(json.dumps(names) if args.json else " ".join(names))
        return 0
    rows = [{"name": d.name, "status": d.status(), "installed": d.installed(), "versions": d.versions(),
             "devices": list(d.devices) if d.devices else None, "module": d.module, "extra": d.extra,
             "install": d.install_hint, "remedy": d.remedy(), "origin": d.origin} for d in decls]
    if args.json:
        print(json.dumps({"backends": rows, "conflicts": REGISTRY.conflicts}, indent=1))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items()) or "-"
        devices = ",".join(r["devices"] or ["(module)"])
        line = f"{r['name']:<{width}}  {r['status']:<12}  {devices:<8}  {versions}"
        if not r["installed"]:
            line = f"{r['name']:<{width}}  {r['status']}\n{'':<{width}}  -> {r['remedy']}"
        print(line)
    for c in REGISTRY.conflicts:
        print(f"warning: {c}")
    return 0


# ---- the parser ---------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="attnconf: conformance of scaled dot-product attention")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("certify", help="run the suite on a kernel; write the run file and a certificate")
    c.add_argument("--backend", required=True, help="framework the kernel is written for (see: attnconf backends)")
    c.add_argument("--kernel", help="MODULE:ATTR, importable from the current folder or PYTHONPATH "
                                    "(without it: the backend's own implementations, see --impl)")
    c.add_argument("--convention", help="how the kernel is called (default: the backend's)")
    c.add_argument("--device", default="cpu", help="cpu, cuda (torch) or gpu (jax, tensorflow); default cpu")
    c.add_argument("--capabilities", help="FILE.toml declaring the kernel's scope")
    c.add_argument("--divergences-dir", help="folder of divergence files <backend>.toml (default: the backend pack's divergences.toml)")
    c.add_argument("--impl", help="without --kernel: only these implementations of the backend (comma-separated)")
    c.add_argument("--profile", default="ci", help="Hypothesis profile: dev, ci (default) or thorough")
    c.add_argument("--seed", type=int, help="Hypothesis seed")
    c.add_argument("--out", default="attnconf-out", help="output folder (default attnconf-out/)")
    c.add_argument("--isolate", action="store_true", help="run the kernel in a worker process (crashes are contained)")
    c.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    c.set_defaults(func=certify)

    r = sub.add_parser("report", help="merge run files into README.md, index.html and certificates")
    r.add_argument("runs", nargs="+", help="run JSON files")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--spec", help="spec folder (default: attnconf's)")
    r.set_defaults(func=report)

    y = sub.add_parser("replay", help="show a saved failing case, or run the test that saved it on it")
    y.add_argument("case", help="a .npz saved by a failing run")
    y.add_argument("--backend")
    y.add_argument("--kernel")
    y.add_argument("--convention")
    y.add_argument("--capabilities")
    y.add_argument("--divergences-dir", help="the folder of divergence files the failing run used")
    y.add_argument("--impl")
    y.add_argument("--device", default="cpu")
    y.add_argument("--isolate", action="store_true")
    y.add_argument("--test", help="a test node id (as printed by the failure) or a -k expression")
    y.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    y.set_defaults(func=replay)

    b = sub.add_parser("backends", help="list the backends: installed or not, versions, what to install")
    b.add_argument("--names", action="store_true", help="only the names of the backends this attnconf ships adapters for")
    b.add_argument("--installed", action="store_true", help="only the backends installed here")
    b.add_argument("--json", action="store_true", help="JSON output")
    b.add_argument("--matrix", action="store_true", help="a CI matrix: {include: [{backend, device}, ...]}")
    b.add_argument("--devices", help="with --matrix: only these devices (comma-separated)")
    b.set_defaults(func=backends)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # the reader went away (`attnconf backends | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
