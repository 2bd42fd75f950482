# polyproj — developer entry points. `make demo` and `make test` set up .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.polyproj-installed
MM_DIR ?= ../shared/data/maros_meszaros
# test-min: the declared floors of the core dependencies, in an environment of their own
VENV_MIN  ?= .venv-min
PY_MIN    := $(VENV_MIN)/bin/python
STAMP_MIN := $(VENV_MIN)/.polyproj-min-installed
# make test: pytest-xdist workers (CI has 2 cores; 1 runs the suite in one process)
TEST_WORKERS ?= 2

.PHONY: demo test test-min test-dev lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build of torch first, so nothing pulls a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[all,bench,test]"
	# qpth pins numpy<2 in its metadata but runs with numpy 2
	$(PY) -m pip install -q --no-deps qpth
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/polyproj demo

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)
	$(VENV)/bin/ruff check polyproj tests benchmarks

$(STAMP_MIN): pyproject.toml .ci/min_requirements.py
	test -x $(PY_MIN) || $(PYTHON) -m venv $(VENV_MIN)
	$(PY_MIN) -m pip install -q --upgrade pip
	$(PY_MIN) -m pip install -q $$($(PYTHON) .ci/min_requirements.py pyproject.toml) pytest pytest-timeout hypothesis
	$(PY_MIN) -m pip install -q --no-deps -e .
	touch $(STAMP_MIN)

# the core tests (marker `core`: no optional package needed) on the minimum versions polyproj declares
test-min: $(STAMP_MIN)
	$(PY_MIN) -m pip freeze | grep -i -E "^(numpy|scipy|array.api.compat|rich|threadpoolctl)="
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY_MIN) -m pytest -q -p no:cacheprovider -m core

test-dev: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(STAMP)
	$(VENV)/bin/ruff check polyproj tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_projection.py

clean:
	rm -rf $(VENV) $(VENV_MIN) build *.egg-info .pytest_cache .hypothesis
