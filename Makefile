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
# test-floors: the core floors and the solver extras' floors together (their backends' tests)
VENV_FLOORS  ?= .venv-floors
PY_FLOORS    := $(VENV_FLOORS)/bin/python
STAMP_FLOORS := $(VENV_FLOORS)/.polyproj-floors-installed
SOLVER_EXTRAS := proxsuite,osqp,highs,piqp,clarabel,daqp
FLOOR_TESTS := tests/test_floors_session53.py tests/test_backend_glue.py tests/test_backend_guard.py \
	tests/test_backends_session50.py tests/test_backends_session51.py tests/test_conformance.py \
	tests/test_osqp_highs.py tests/test_presolve_session50.py tests/test_proxsuite_session48.py \
	tests/test_proxsuite_session49.py tests/test_solve_proxsuite.py tests/test_solvers_probe_s47.py \
	tests/test_guard_session48.py tests/test_guard_session50.py
# make test: pytest-xdist workers (CI has 2 cores; 1 runs the suite in one process)
TEST_WORKERS ?= 2

.PHONY: demo test test-min test-floors test-dev lint bench clean

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

$(STAMP_FLOORS): pyproject.toml .ci/min_requirements.py
	test -x $(PY_FLOORS) || $(PYTHON) -m venv $(VENV_FLOORS)
	$(PY_FLOORS) -m pip install -q --upgrade pip
	$(PY_FLOORS) -m pip install -q $$($(PYTHON) .ci/min_requirements.py pyproject.toml --extras $(SOLVER_EXTRAS)) \
		pytest pytest-timeout pytest-xdist hypothesis array-api-strict
	$(PY_FLOORS) -m pip install -q --no-deps -e .
	touch $(STAMP_FLOORS)

# the solver backends' tests on the declared floors of the core and of every solver extra (no torch there: the
# tests that need it skip)
test-floors: $(STAMP_FLOORS)
	$(PY_FLOORS) -m pip freeze | grep -i -E "^(numpy|scipy|proxsuite|osqp|highspy|piqp|clarabel|daqp)="
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY_FLOORS) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) \
		$(FLOOR_TESTS)

test-dev: $(STAMP)
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(STAMP)
	$(VENV)/bin/ruff check polyproj tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_projection.py

clean:
	rm -rf $(VENV) $(VENV_MIN) $(VENV_FLOORS) build *.egg-info .pytest_cache .hypothesis
