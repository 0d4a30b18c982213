#!/usr/bin/env bash
# The checkout installed editable into a lent machine's own python (no venv, no network there), as `make setup`
# installs it into .venv: without it `import attnconf` in a checkout stops and names the fix. The machine is
# fresh each time, so its python may be changed (PIP_BREAK_SYSTEM_PACKAGES: a distribution's python refuses
# otherwise); the build uses the setuptools already there (>= 64 has editable installs).
# Never point it at a shared venv: it installs into whatever python it is given.
#
#   bash bench/install_checkout.sh [PYTHON]
set -u
PY=${1:-python3}
cd "$(dirname "$0")/.." || exit 2
if "$PY" -c "import attnconf.spec" 2>/dev/null; then exit 0; fi
if ! PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
   || ! "$PY" -c "import attnconf.spec"; then
  echo "attnconf: could not install this checkout into $PY (pip install --no-deps --no-build-isolation -e .)"
  exit 2
fi
