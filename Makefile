# attnconf: two commands on a fresh machine.
#   make report   conformance of every installed backend on this CPU; writes reports/
#   make test     the project's own tests, the suite on the reference, every backend's divergence witnesses,
#                 the catalogue of buggy kernels
# Every package comes from requirements.lock (`make lock` regenerates it).
PY      := .venv/bin/python
PIP     := $(PY) -m pip
LOCK    := requirements.lock
STAMP   := .venv/.attnconf-setup-3
export OPENBLAS_NUM_THREADS ?= 1
# the emulated baselines, kept between the runs of make test and make report (reference/shared_results.py)
export ATTNCONF_BASELINE_CACHE ?= $(CURDIR)/.attnconf-cache/baselines
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup lock report test test-own test-install test-suites test-catalogue test-proof test-long long bench clean

setup: $(STAMP)

$(STAMP): $(LOCK) pyproject.toml setup.py
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q -r $(LOCK)
	@# this checkout, editable: its top-level folders import as attnconf.spec, attnconf.adapters, ... (pyproject's
	@# package-dir); built with the locked setuptools, nothing else installed
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@# tinygrad's CPU device compiles its kernels with clang: install it where we may (root with apt-get);
	@# otherwise `pytest conformance --backend=tinygrad` says in one line that clang is missing.
	@command -v $${CC:-clang} >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null) \
	      || echo "attnconf: apt-get could not install clang; the tinygrad backend will not run"; \
	  else echo "attnconf: clang not found (install it: apt-get install clang); the tinygrad backend will not run"; fi; }
	touch $(STAMP)

# Resolve every requirement (pyproject's dependencies and all extras, tools/requirements.py) in a
# clean venv and pin the result. Packages already locked keep their versions unless UPGRADE=1.
lock:
	rm -rf .lock-venv
	python3 -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	python3 tools/requirements.py > .lock-venv/requirements.txt
	.lock-venv/bin/python -m pip install -q -r .lock-venv/requirements.txt \
	    $(if $(filter 1,$(UPGRADE)),,$(if $(wildcard $(LOCK)),-c $(LOCK)))
	{ sed -n '1,/^$$/p' $(LOCK) 2>/dev/null | grep '^#' || true; echo; \
	  .lock-venv/bin/python -m pip freeze --all; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf .lock-venv

report: setup
	$(PY) -m attnconf.reports.runall

test: setup test-own test-suites test-catalogue

test-own: setup
	$(PY) -m pytest tests adapters -q -m "not slow" -p no:cacheprovider -n 2 --durations=15

# attnconf installed into fresh venvs outside the checkout (slow: see tests/test_install.py)
test-install: setup
	$(PY) -m pytest tests/test_install.py -q -m slow -p no:cacheprovider

# The suite itself, end to end, on the reference; then every installed backend's divergence entries,
# each witness run on this machine (entries_check --witnesses). The whole ci suites of every backend
# are `make report`'s job (reports/runall.py).
test-suites: setup
	$(PY) -m pytest conformance --backend=numpy --hypothesis-profile=ci -q -p no:cacheprovider \
	    --report=.attnconf-ci/numpy.json
	$(PY) -m attnconf.conformance.engine.entries_check --witnesses --out .attnconf-ci

# test_verdicts first: its hanging-kernel run (the whole suite under --isolate, 1 to 3 min) then overlaps the catalogue on the other worker
test-catalogue: setup
	$(PY) -m pytest tests/test_verdicts.py tests/test_catalogue.py tests/test_catalogue_conventions.py \
	    tests/test_variant_catalogue.py tests/test_catalogue_2026_a.py tests/test_catalogue_2026_b.py tests/test_memory_determinism_catalogue.py tests/test_branch_catalogue.py tests/test_runner.py -q \
	    -m "slow and not long" -p no:cacheprovider -n 2 --durations=10

# the clause-by-clause proof, re-measured: one restricted suite run per normative clause (bench/clause_proof.json,
# spec/PROOF.md; `make test` checks the committed measurement) and the boundary crossings of one numpy ci run
test-proof: setup
	$(PY) -m bench.clause_proof && $(PY) -m bench.clause_proof --render
	$(PY) -m pytest tests/test_boundaries.py -q -m slow -p no:cacheprovider -s

# How fast the suite is here, against the floor (interpreter + framework imports): bench/results.json and the
# README's speed table. BENCH_ARGS adds the long parts: --all-backends, --make-test, --make-report.
bench: setup
	$(PY) bench/bench_suite.py $(BENCH_ARGS)

test-long: setup
	$(PY) -m pytest tests/test_catalogue_conventions.py tests/test_catalogue_2026_a.py tests/test_catalogue_2026_b.py tests/test_long_catalogue.py -q -m long -p no:cacheprovider -n 2

long: setup
	$(PY) -m pytest conformance --backend=torch --long --measure-memory -k "long or memory" -q

clean:
	rm -rf .venv .lock-venv .attnconf-ci reports/failures build *.egg-info attnconf-out .attnconf-cache
