# The two commands of the README, plus the checks and benchmarks they are built from.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo demo-cli test lint bench bench-analytics venv services chaos

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@touch $@

venv: $(VENV)/.installed

## First command: the demo on embedded defaults (SQLite, in-process, the built-in fake provider).
demo: venv
	@bash scripts/demo.sh

## The one-shot command-line demo: one run with injected faults, streamed to the terminal.
demo-cli: venv
	@bash scripts/demo.sh cli

## Second command: the whole suite on the real PostgreSQL and Redis (started when not running),
## in two processes; the tests that share the services stay in one (tests/conftest.py).
test: venv
	@bash scripts/ensure_services.sh
	@bash scripts/ensure_chromium.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## Every benchmark but the analytics history: writes BENCHMARKS.md (needs PostgreSQL and Redis).
bench: venv
	@bash scripts/ensure_services.sh
	$(PY) -m bench.report

## The analytics benchmark (generates a history of a million events once): its BENCHMARKS.md section.
bench-analytics: venv
	@bash scripts/ensure_services.sh
	$(PY) -m bench.report --only analytics

## The chaos harness: 100 runs through the distributed stack under kills, restarts and faults
## (docs/chaos.md). Needs PostgreSQL (DATABASE_URL names the server) and redis-server.
chaos: venv
	@bash scripts/ensure_services.sh
	$(PY) -m project.chaos $(CHAOS_ARGS)
