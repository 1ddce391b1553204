# actonce: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: metrics-picture install test test-fast test-sentry2 lint run migrate bench bench-noisy chaos soak soak-plot flower bare docs docs-build clean

# The virtualenv is (re)built when missing or when pyproject.toml changed, so a clean clone
# and a machine that already has one both get exactly what the project declares.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# A module's tests stay in one process (`--dist loadfile`): they share its pools and Redis
# database. `make test TEST_PROCESSES=1` runs them one after another.
TEST_PROCESSES ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# pyproject.toml admits sentry-sdk 2 and 3, and `make test` runs the one pip resolves (3.x): this
# runs the tests that start Sentry again on the newest 2.x, in a virtualenv of its own.
SENTRY2_VENV := .venv-sentry2
SENTRY_TESTS := tests/worker/test_reporting.py tests/worker/test_leaks.py \
	tests/worker/test_errors.py tests/worker/test_unexpected_errors.py \
	tests/worker/test_pool_turn_faults.py

test-sentry2: $(STAMP)
	test -x $(SENTRY2_VENV)/bin/python || $(PYTHON) -m venv $(SENTRY2_VENV)
	$(SENTRY2_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SENTRY2_VENV)/bin/python -m pip install --quiet -e '.[dev]' 'sentry-sdk>=2.75.0,<3'
	$(SENTRY2_VENV)/bin/python -c "import sentry_sdk, sys; \
	print('sentry-sdk', sentry_sdk.VERSION); sys.exit(not sentry_sdk.VERSION.startswith('2.'))"
	$(SENTRY2_VENV)/bin/python -m pytest -n $(TEST_PROCESSES) --dist loadfile $(SENTRY_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check actonce/__init__.py worker tasks demo bench lab tests docs
	$(BIN)/ruff format --check actonce/__init__.py worker tasks demo bench lab tests docs
	$(BIN)/mypy
	$(BIN)/mypy docs/hooks.py

# `make run PG=1` keeps the demo's stores in an embedded PostgreSQL instead of SQLite files.
run: $(STAMP)
	$(if $(PG),ACTONCE_DEMO_POSTGRES=1) $(BIN)/python -m demo

migrate: $(STAMP)
	$(BIN)/actonce migrate

bench: $(STAMP)
	$(BIN)/python -m bench.bench

# A quiet tenant alone and during another's burst of 1,000, and ten tenants bursting at once,
# with fair share off and on: bench/results/<date>-noisy.json and docs/images/noisy-neighbour.png.
bench-noisy: $(STAMP)
	$(BIN)/python -m bench.noisy

# docs/images/pool-metrics.png: a Prometheus scraping every process of a `make run`, plotted.
metrics-picture: $(STAMP)
	$(BIN)/python -m lab.metrics_picture

# `make chaos N=10000` for the long run; the suite runs the same harness on 100 runs.
chaos: $(STAMP)
	$(BIN)/python -m bench.chaos $(if $(N),--runs $(N))

# `make soak` feeds 100,000 runs to a pool of 2 and samples its memory, descriptors, Redis and
# tables every 10,000 (`make soak N=5000 EVERY=1000` for a shorter one); `make soak-plot` draws
# the newest result to docs/images/soak.png.
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(if $(N),--runs $(N)) $(if $(EVERY),--every $(EVERY))

soak-plot: $(STAMP)
	$(BIN)/python -m bench.soak_plot

# Joins the demo's Flower when one already answers on 5555.
flower: $(STAMP)
	$(BIN)/python -m lab.flower

# The README's promise on a bare machine: no redis-server or postgres on PATH, REDIS_URL and the
# tests' PostgreSQL at a closed port; the demo and the whole suite still run, no test skipped for
# want of a server (what CI checks; the suite takes a quarter of an hour or more).
# `make bare TEST_PROCESSES=1` runs the suite's modules one after another.
bare: $(STAMP)
	TEST_PROCESSES=$(TEST_PROCESSES) $(BIN)/python -m lab.bare

# The docs site (mkdocs.yml, docs/): `make docs` serves it on 127.0.0.1:8000 and rebuilds on
# each change; `make docs-build` is CI's build, every warning an error. Material's end-of-life
# notice would print on every build: it is the theme's news, not a warning about this site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(SENTRY2_VENV) var site .pytest_cache .mypy_cache .ruff_cache
