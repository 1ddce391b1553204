# actonce: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast lint run migrate bench chaos flower clean

# The virtualenv is (re)built when missing or when pyproject.toml changed, so a clean clone
# and a machine that already has one both get exactly what the project declares.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check actonce/__init__.py worker tasks demo bench lab tests
	$(BIN)/ruff format --check actonce/__init__.py worker tasks demo bench lab tests
	$(BIN)/mypy

run: $(STAMP)
	$(BIN)/python -m demo

migrate: $(STAMP)
	$(BIN)/actonce migrate

bench: $(STAMP)
	$(BIN)/python -m bench.bench

chaos: $(STAMP)
	$(BIN)/python -m bench.chaos

flower: $(STAMP)
	$(BIN)/celery -A actonce.worker.app flower --port=5555 --address=127.0.0.1

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
