# Set-up is part of every target: a fresh clone needs only python3 (>= 3.11) and make.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml proto/oasis/v1/oasis.proto
	$(PYTHON) -m venv $(VENV)
	@# uv resolves and installs the same packages from the same index as pip, in about
	@# 30 s where pip takes about 2 minutes here; pip does it if uv fails. Compiled to
	@# bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process of
	@# the suite compiled SQLAlchemy, numpy, grpc... again without it (29.6 min, not 18)
	@{ $(BIN)/pip install --quiet uv && \
	   $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'; } || \
	 { echo "uv failed: installing with pip"; \
	   $(BIN)/pip install --quiet --upgrade pip && $(BIN)/pip install --quiet -e '.[dev]'; }
	$(BIN)/python proto/generate.py
	@echo "compiling the numeric kernels once (numba's cache; about 20 s)"
	$(BIN)/oasis replay config/demo-trace.json > /dev/null
	touch $(STAMP)

## run: the daemon on its embedded defaults (SQLite under ./data, a small demo cluster)
run: $(STAMP)
	$(BIN)/oasisd

## test: formatting, lint, types, then the whole test suite, in three processes, one test
## file per process (a file's daemons and brokers are shared by its tests). Most tests wait
## on daemons, brokers and databases they start: with two processes, two cores were 70%
## busy (990 s here); with three, 87% (808 s, the same 1,648 tests passing)
## The project's bytecode is written first: the suite starts daemons and the CLI as
## hundreds of processes, and where PYTHONDONTWRITEBYTECODE is set each of them compiled
## every module again (1.3 s of CPU a process here).
TEST_WORKERS ?= 3
test: lint
	$(BIN)/python -m compileall -q controller pricing bench migrations tests > /dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

## bench: the decision-latency benchmark (see bench/RESULTS.md)
bench: $(STAMP)
	$(BIN)/python -m bench.decision_latency

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
