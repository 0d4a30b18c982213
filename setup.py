"""The wheel's package list, found rather than written out: every folder with an __init__.py below the
folders pyproject's package-dir maps inside `attnconf` (a package added there, such as a backend pack
adapters/<backend>/, is in the wheel and the editable install without an edit here). The rest of the
build's configuration is pyproject.toml's; setuptools' declarative discovery cannot add the prefix."""
from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    """`attnconf` and each mapped folder's packages under their `attnconf.` names."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    return sorted(name + (f".{sub}" if sub else "") for name, folder in mapping.items()
                  for sub in ("", *find_packages(str(ROOT / folder))))


if __name__ == "__main__":
    setup(packages=packages())
