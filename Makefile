# Every target creates .venv and installs shardwise into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo check lint typecheck test format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,all,bench]'
	touch $(STAMP)

install: $(STAMP)

## The main job: the tutorial's scenarios on 8 simulated CPU devices (or the real accelerators).
demo: $(STAMP)
	$(BIN)/shardwise demo

## The whole check suite: lint, type check, tests and doctests.
check: lint typecheck test

lint: $(STAMP)
	$(BIN)/ruff format --check src tests conftest.py
	$(BIN)/ruff check src tests conftest.py
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP)
	$(BIN)/python -m pytest

format: $(STAMP)
	$(BIN)/ruff format src tests conftest.py
	$(BIN)/ruff check --fix src tests conftest.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
