# dynrunner: every target creates and uses one virtual environment at .venv/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
STAMP := $(VENV)/.installed
PKGS := -e proto -e executor -e controller -e tests/doubles

.PHONY: venv test test-fast lint proto requirements clients clients-lock demo bench clean

venv: $(STAMP)

$(STAMP): requirements-dev.txt proto/pyproject.toml executor/pyproject.toml controller/pyproject.toml tests/doubles/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(BIN)/pip install -q uv==0.13.9
	$(UV) pip install -q -p $(BIN)/python -r requirements-dev.txt
	$(UV) pip install -q -p $(BIN)/python --no-deps $(PKGS)
	@touch $(STAMP)

test: lint clients
	$(BIN)/python -m pytest -q tests

# The JavaScript clients real actions are built on (tests only): `npm ci` from tests/clients/.
clients: venv
	$(BIN)/python -m tests.fixtures.clients

# After editing tests/clients/package.json: a new lock, without registry URLs.
clients-lock: venv
	$(BIN)/python -m tests.fixtures.clients --relock

test-fast: venv
	$(BIN)/python -m pytest -q -x tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

proto: venv
	$(BIN)/python proto/generate.py
	$(BIN)/python tests/doubles/generate.py

requirements: venv
	$(UV) pip compile -q requirements-dev.in -o requirements-dev.txt -p 3.11 --no-header
	$(UV) pip compile -q executor/requirements.in -o executor/requirements.txt -p 3.11 --no-header
	$(UV) pip compile -q controller/requirements.in -o controller/requirements.txt -p 3.11 --no-header

demo: venv
	$(BIN)/dynrunner-controller demo

# Benchmarks print figures and ratios; they assert nothing about time (not part of `test`).
bench: venv
	$(BIN)/python -m pytest -q -s -o python_files='bench_*.py' tests/bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
