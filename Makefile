# Set-up is part of every target: a fresh clone needs only python3 (>= 3.11) and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## run: replay the demo trace (the daemon, oasisd, arrives with issue 3)
run: $(STAMP)
	$(BIN)/oasis replay config/demo-trace.json

## test: formatting, lint, types, then the whole test suite
test: lint
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

## bench: the decision-latency benchmark (see bench/RESULTS.md)
bench: $(STAMP)
	$(BIN)/python -m bench.decision_latency

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
