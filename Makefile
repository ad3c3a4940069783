# Every target creates .venv and installs shardwise into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo check lint typecheck test test-fast test-newest docs package format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,all,bench,docs,models]'
	touch $(STAMP)

install: $(STAMP)

## The main job: the tutorial's scenarios on 8 simulated CPU devices (or the real accelerators).
demo: $(STAMP)
	$(BIN)/shardwise demo

## The whole check suite: lint, type check, tests and doctests, the documentation site (with
## the example notebooks executed), and the wheel installed without extras and used.
check: lint typecheck test docs package

lint: $(STAMP)
	$(BIN)/ruff format --check src tests examples conftest.py
	$(BIN)/ruff check src tests examples conftest.py
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

## Three workers on two cores: many tests wait on the processes they launch (a launch of two
## processes, a timeout, a killed stream resumed), and a third worker fills that time
## (9:49 against 10:26 for two workers, back to back on a 2-core x86 machine with 24 GiB, both
## with a run-wide compilation cache the suite no longer keeps; 7:45 without it, three workers).
test: $(STAMP)
	$(BIN)/python -m pytest -n 3 --dist worksteal --durations=25

## The edit-test loop: every test but those marked slow (`make test` and `make check` run all).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 3 -m "not slow"

## The documentation site, built into site/ (warnings are errors); first the example notebooks
## are executed into docs/examples/, where examples/execute.py exists.
docs: $(STAMP)
	if [ -f examples/execute.py ]; then $(BIN)/python examples/execute.py --out docs/examples; fi
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

## The wheel and sdist built and checked, the wheel installed without extras into a fresh
## virtual environment, and a smoke test there (scripts/wheel_smoke.sh): beside the newest JAX
## its requirement admits, beside the oldest JAX shardwise supports, and where a Python 3.12
## is at hand, beside the newest JAX of all (JAX 0.11 and later need Python 3.12).
OLDEST_JAX := 0.9.2
PYTHON_NEWEST ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	"$$p" -c "" 2>/dev/null && echo "$$p" && break; done)
package: $(STAMP)
	scripts/wheel_smoke.sh $(BIN)/python
	scripts/wheel_smoke.sh $(BIN)/python $(OLDEST_JAX)
	if [ -n "$(PYTHON_NEWEST)" ]; then scripts/wheel_smoke.sh $(BIN)/python "" $(PYTHON_NEWEST); \
	else echo "package: no python3.12 here: the wheel is not tried beside JAX 0.11 or later"; fi

## The whole test suite on the newest JAX pip serves, in .venv-newest (JAX 0.11 and later need
## Python 3.12; `make check` runs the suite on the newest JAX that Python 3.11 gets, and tries
## the installed wheel beside the newest of all).
NEWEST := .venv-newest
test-newest:
	@if [ -z "$(PYTHON_NEWEST)" ]; then echo "test-newest: no python3.12 here"; exit 1; fi
	if [ ! -x $(NEWEST)/bin/python ]; then $(PYTHON_NEWEST) -m venv $(NEWEST); fi
	$(NEWEST)/bin/python -m pip install --quiet --upgrade pip
	$(NEWEST)/bin/python -m pip install --quiet --upgrade -e '.[dev,all,bench,docs,models]' jax jaxlib
	$(NEWEST)/bin/python -c "import jax; print('test-newest: on JAX', jax.__version__)"
	$(NEWEST)/bin/python -m pytest -n 3 --dist worksteal

format: $(STAMP)
	$(BIN)/ruff format src tests examples conftest.py
	$(BIN)/ruff check --fix src tests examples conftest.py

clean:
	rm -rf $(VENV) $(NEWEST) .pytest_cache .mypy_cache .ruff_cache site docs/examples
