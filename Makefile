# polyproj — developer entry points. `make demo` and `make test` set up .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.polyproj-installed
MM_DIR ?= ../shared/data/maros_meszaros

.PHONY: demo test test-dev lint bench clean

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
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -p no:cacheprovider
	$(VENV)/bin/ruff check polyproj tests benchmarks

test-dev: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check polyproj tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_projection.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
