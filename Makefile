# Two entry points a newcomer needs: `make run` (the whole stack, embedded) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test lint bench pgbouncer chromium install install-dev clean replay-baseline

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The stamp files make re-installs happen only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev chromium

run: $(VENV)/.installed
	$(BIN)/aijobs dev $(ARGS)

# The suite on PYTEST_WORKERS pytest-xdist workers, each with its own PostgreSQL and Temporal
# dev server (tests/conftest.py): most tests wait on Temporal timers and I/O, not on a core.
# PYTEST_WORKERS=0 runs it in this one process. `worksteal`: a worker that runs out of tests takes
# half of another's, so neither runs alone at the end.
# Bytecode is written (to the checkout's ignored __pycache__ dirs) even where the shell sets
# PYTHONDONTWRITEBYTECODE, as many images do: otherwise every worker, every subprocess the tests
# start and every workflow run's sandbox compiles our modules again, and pytest rewrites the
# asserts of every test module at each run. compileall first: the workers start from bytecode.
PYTEST_WORKERS ?= 2
PACKAGES := engine db providers jobs workflows activities api runtime
test: $(VENV)/.installed-dev chromium
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES) bench tests
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The replay baseline (docs/versioning.md): record tag $(TAG) again from real runs (embedded
# PostgreSQL and a Temporal dev server), then replay every kept history and check its coverage.
TAG ?= v8
replay-baseline: $(VENV)/.installed-dev
	$(BIN)/python -m tests.replay.record --tag $(TAG)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/replay tests/unit/test_recorded_payloads.py

# The API figure's load generator is wrk (a native client, so the client is never the
# bottleneck); without it the bench falls back to its Python client and says so in the table.
bench: $(VENV)/.installed-dev
	@command -v wrk >/dev/null || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq wrk; \
	} || echo "bench: could not install wrk; the API figure uses the Python client" >&2
	$(BIN)/python -m bench $(ARGS)

# The transaction pooler the pooler and cluster tests run the engine behind: Debian's PgBouncer
# (1.18 on Debian 12, no protocol-level prepared statements). Those tests skip without it.
pgbouncer:
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq pgbouncer; \
	}

# The console's browser tests (tests/e2e/test_console.py) drive Debian's chromium through
# Playwright's executable_path: no browser download. Installed here only when missing; where it
# cannot be, those tests fail and name this command.
CHROMIUM_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get update && apt-get install -y chromium
chromium:
	@command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		$$sudo sh -c '$(CHROMIUM_INSTALL)' >/dev/null; \
	} || echo "chromium: could not install it ($(CHROMIUM_INSTALL)); the browser tests will fail" >&2

clean:
	rm -rf $(VENV) .aijobs .pytest_cache .mypy_cache .ruff_cache
