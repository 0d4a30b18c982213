"""Print every requirement the lock covers, one per line: attnconf's dependencies and all its extras.

    python3 tools/requirements.py            # what `make lock` installs into a clean venv

Read from pyproject.toml (whose extras tests/test_packaging.py checks against the backend registry),
so the lock always covers every backend of the registry.
"""
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
reqs = list(project["dependencies"])
for extra in project["optional-dependencies"].values():
    reqs += [r for r in extra if r not in reqs]
sys.stdout.write("".join(f"{r}\n" for r in reqs))
