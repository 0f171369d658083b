# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates what it needs (virtual environment, Airflow home, simulator) itself.
SHELL  := /bin/bash
# Each suite and subprocess imports the same modules: let Python keep their bytecode (__pycache__ is ignored by git).
unexport PYTHONDONTWRITEBYTECODE
.SHELLFLAGS := -eu -o pipefail -c  # a figure script that fails must fail the target, even behind a grep
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CHAOS_LOG := .airflow/chaos-client/chaos.log

.PHONY: install dist lint typecheck test test-all test-fast test-airflow3 test-airflow2 test-airflow2-all test-wheel test-simulator test-late demo demo-airflow2 docs docs-serve bench chaos system ui-test fleet system-airflow2 system-airflow32 services browser clean

# The main environment: the Airflow that `make demo`, `make system` and `make chaos` run, and the first leg of the
# tests. The second leg runs the same tests on the newest Airflow 2.11.x, in a virtual environment of its own.
# Each stamp names the Airflow version asked for, so `make test AIRFLOW2=2.11.0` installs that one; "newest
# 2.11.x" is whatever was newest when .venv-airflow2 was made (`make clean` to take a newer one).
AIRFLOW3  ?= 3.3.2
AIRFLOW2  ?= 2.11.*
VENV2     := .venv-airflow2
STAMP     := $(VENV)/.installed-airflow-$(AIRFLOW3)
STAMP2    := $(VENV2)/.installed-airflow-$(subst *,x,$(AIRFLOW2))
PIP_QUIET := --quiet --disable-pip-version-check

# The simulator, a distribution of its own (simulator/): every venv that runs the tests, the demo or the benchmarks
# installs it beside the provider.
SIM := -e ./simulator

# The FAB auth manager (Airflow 3 only), which most production deployments use: the GPU rentals page's per-DAG
# rules are tested with it (tests/integration/test_gpu_rentals_page_fab.py, make ui-test).
FAB := apache-airflow-providers-fab==3.10.2

$(STAMP): pyproject.toml simulator/pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[dev]' $(SIM) "apache-airflow==$(AIRFLOW3)" $(FAB)
	@touch $(STAMP)

install: $(STAMP)

$(STAMP2): pyproject.toml simulator/pyproject.toml Makefile
	@test -x $(VENV2)/bin/python || $(PYTHON) -m venv $(VENV2)
	$(VENV2)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(VENV2)/bin/python -m pip install $(PIP_QUIET) -e '.[dev]' $(SIM) "apache-airflow==$(AIRFLOW2)"
	@touch $@

# The hooks of .pre-commit-config.yaml on every tracked file: ruff (check and format), merge-conflict markers,
# trailing whitespace, end of file, large files. Their tools are the dev extra's, found on PATH (.venv/bin first).
lint: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pre-commit run --all-files --show-diff-on-failure

typecheck: install
	$(BIN)/mypy airflow_gpumarket
	$(BIN)/mypy simulator/gpumarket_simulator

# Day-to-day: lint, types and the suite on Airflow 3.3.2 only. The benchmarks' smoke run goes on beside the suite
# (it mostly waits on its simulators); each prints its output whole when it ends.
test-fast: lint typecheck
	$(MAKE) --no-print-directory -j2 --output-sync=target bench-quick test-airflow3
	$(MAKE) --no-print-directory test-simulator

# The suites mostly wait (on the simulators' clocks, on subprocesses), so each runs in this many processes
# (pytest-xdist); each process has an Airflow home, a database and simulators of its own. 1 runs them in one.
# worksteal: a process that ran out of tests takes some of another's, so that no process ends long after the rest.
PYTEST_WORKERS ?= 4
PYTEST_N := $(if $(filter 1,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal)

test-airflow3: install
	@echo "== tests on Airflow $(AIRFLOW3)"
	$(BIN)/pytest $(PYTEST_N) --ignore=tests/simulator --ignore=tests/cli

# The simulator's and the official CLI's suites do not import Airflow: they run once, in the main environment.
test-simulator: install
	@echo "== the simulator's and the official CLI's suites"
	$(BIN)/pytest $(PYTEST_N) tests/simulator tests/cli

# What make test runs beside the 2.11 leg, one after the other: the wheels, then the suites that need no Airflow.
test-late:
	$(MAKE) --no-print-directory test-wheel
	$(MAKE) --no-print-directory test-simulator

# The 2.11 leg of make test: the tests whose code path differs between Airflow versions (the every_airflow marker,
# set by tests/conftest.py: those using the metadata database, and the triggers', UI's, commands', decorators',
# sensors', notifications' and hooks' suites). The others test the provider's own rules on plain contexts and fakes,
# the same code on every version; test-airflow2-all runs them on 2.11 too, and make test-all runs that leg.
V2_MARKS := every_airflow and not system and not live
test-airflow2: $(STAMP2)
	@echo "== tests on Airflow $$($(VENV2)/bin/python -c 'import airflow; print(airflow.__version__)'): those whose path differs by version"
	$(VENV2)/bin/pytest $(PYTEST_N) --ignore=tests/simulator --ignore=tests/cli -m "$(V2_MARKS)"

test-airflow2-all: $(STAMP2)
	@echo "== the whole suite on Airflow $$($(VENV2)/bin/python -c 'import airflow; print(airflow.__version__)')"
	$(VENV2)/bin/pytest $(PYTEST_N) --ignore=tests/simulator --ignore=tests/cli

# The packages as users get them: both wheels (the provider's and the simulator's) are built, their metadata checked
# (twine check --strict), each checked to hold only its own package (scripts/check_wheels.py: no simulator code in
# the provider's, and the provider requires neither FastAPI nor uvicorn), installed into a clean virtual
# environment, and the demo's DAG run from that install. The runs start outside the checkout with PYTHONSAFEPATH,
# so nothing is imported from the source tree.
WHEEL_DIR := .airflow/wheel
test-wheel: install
	@echo "== the wheels, installed into a clean virtual environment"
	rm -rf $(WHEEL_DIR) build simulator/build && mkdir -p $(WHEEL_DIR)/run
	$(BIN)/python -m pip wheel $(PIP_QUIET) --no-deps --wheel-dir $(WHEEL_DIR) . ./simulator
	$(BIN)/twine check --strict $(WHEEL_DIR)/*.whl
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/python -m pip install $(PIP_QUIET) $(WHEEL_DIR)/*.whl "apache-airflow==$(AIRFLOW3)"
	cd $(WHEEL_DIR)/run && PYTHONSAFEPATH=1 ../venv/bin/python $(CURDIR)/scripts/check_wheels.py ../*.whl
	cd $(WHEEL_DIR)/run && PYTHONSAFEPATH=1 ../venv/bin/python -c 'import airflow_gpumarket, gpumarket_simulator, sys; \
		wrong = [p.__file__ for p in (airflow_gpumarket, gpumarket_simulator) if "/site-packages/" not in p.__file__]; \
		sys.exit(f"imported from {wrong}, not the wheels" if wrong else 0)'
	cd $(WHEEL_DIR)/run && GPUMARKET_DEMO_HOME=$(CURDIR)/$(WHEEL_DIR)/home PYTHONSAFEPATH=1 \
		../venv/bin/python $(CURDIR)/scripts/demo.py

# The two wheels users install until a release is published (the provider's and the simulator's), into dist/.
dist: install
	rm -rf dist build simulator/build && mkdir -p dist
	$(BIN)/python -m pip wheel $(PIP_QUIET) --no-deps --wheel-dir dist . ./simulator
	$(BIN)/twine check --strict dist/*.whl
	@ls -1 dist/*.whl

# The 2.11 leg and the wheels' check run side by side, after the first leg.
# Both environments are built side by side (lint and typecheck need the first), so that no suite shares the machine
# with an install.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target lint typecheck $(STAMP2)
	$(MAKE) --no-print-directory -j2 --output-sync=target bench-quick test-airflow3
	$(MAKE) --no-print-directory -j2 --output-sync=target test-airflow2 test-late

# make test, then the whole suite on Airflow 2.11 (not only the tests whose path differs by version): what a closing
# note runs.
test-all: test
	$(MAKE) --no-print-directory test-airflow2-all

demo: install
	$(BIN)/python scripts/demo.py

# The live acceptance suite (tests/live): one short rental on the service GPUMARKET_LIVE_CONN names, refused before
# renting when its worst case is above GPUMARKET_LIVE_MAX_SPEND (default $0.10); a LIVE line per assumption of
# docs/reference/live-service.md. Real money: not part of `make test`. live-check-sim runs it against
# `gpumarket-sim --local` (scripts/live_check_sim.py; about a minute), which a test of `make test` runs faster.
.PHONY: live-check live-check-sim
live-check: install
	@test -n "$${GPUMARKET_LIVE_CONN:-}" || { echo "live-check: set GPUMARKET_LIVE_CONN (JSON or URI)"; exit 2; }
	$(BIN)/pytest tests/live -m live

live-check-sim: install
	$(BIN)/python scripts/live_check_sim.py

# The same demo on the newest Airflow 2.11.x (its own Airflow home, .airflow/airflow2).
demo-airflow2: $(STAMP2)
	$(VENV2)/bin/python scripts/demo.py

# The documentation site (mkdocs.yml, docs/), built with warnings as errors into site/. Its tools live in a virtual
# environment of their own, pinned, never in .venv nor among the provider's dependencies. The how-to guides show
# example DAGs written into them by scripts/docs_examples.py; the build stops if one differs from its file.
DOCS_VENV  := .venv-docs
DOCS_PINS  := mkdocs==1.6.1 mkdocs-material==9.8.1 pymdown-extensions==13.1
# A changed pin changes the Makefile, which reinstalls them.
DOCS_STAMP := $(DOCS_VENV)/.installed
$(DOCS_STAMP): Makefile
	@test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install $(PIP_QUIET) $(DOCS_PINS)
	@touch $@

docs: $(DOCS_STAMP)
	$(PYTHON) scripts/docs_examples.py --check
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site
	@grep -q 'href="howto/run-job.html"' site/index.html || { echo "site/index.html does not link pages as files: it cannot be read from disk"; exit 1; }
	@echo "Built site/: open site/index.html, or run make docs-serve"

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve --strict

# Figures against the embedded simulator, one line each: NAME: value (goal: ...). Not part of `make test`.
# bench_provider.py prints figure lines only; Airflow's log lines go to .airflow/bench/bench_provider.log.
# P4 measures the provider's operator beside KubernetesPodOperator: the peer's provider is installed in an
# environment of the benchmark's own (with this checkout, editable), never in .venv nor as a dependency.
PEERS       := .airflow/bench/peers
PEERS_STAMP := $(PEERS)/.installed-airflow-$(AIRFLOW3)
$(PEERS_STAMP): pyproject.toml simulator/pyproject.toml Makefile
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install $(PIP_QUIET) -e . $(SIM) "apache-airflow==$(AIRFLOW3)" apache-airflow-providers-cncf-kubernetes
	@touch $@

bench: install $(PEERS_STAMP)
	@mkdir -p .airflow/bench
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_simulator.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_triggerer.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_provider.py --peers-python $(PEERS)/bin/python
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_market.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_market.py --bill-loading
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_deadlines.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_pacing_pods.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_service.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_market_schedule.py

# The same scripts as a smoke run (tiny sizes, the same code paths and lines; under a minute), part of test-fast so
# that a benchmark cannot rot unseen. It fails on an error, not on a missed goal: its figures mean nothing.
.PHONY: bench-quick
bench-quick: install
	@mkdir -p .airflow/bench-quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_simulator.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_triggerer.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_provider.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_market.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_deadlines.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_pacing_pods.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_service.py --quick
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench-quick $(BIN)/python bench/bench_market_schedule.py --quick

chaos: install
	@mkdir -p .airflow/chaos-client
	@echo "chaos: about 7 minutes; the whole output goes to $(CHAOS_LOG)"
	@AIRFLOW_HOME=$(CURDIR)/.airflow/chaos-client $(BIN)/python bench/chaos.py > $(CHAOS_LOG) 2>&1 \
	  || { grep -aE '^R1' $(CHAOS_LOG); echo "make chaos FAILED; last lines of $(CHAOS_LOG):"; \
	       tail -n 40 $(CHAOS_LOG); exit 1; }
	@grep -aE '^R1' $(CHAOS_LOG)

# make system runs what production runs: PostgreSQL and the CeleryExecutor with Redis as its broker. The services
# are Debian's packages, installed when missing (apt needs root), each run by tests/system/deployment.py from a
# temporary folder on a loopback port and stopped afterwards (PostgreSQL as its unprivileged user when run as
# root). The Python side, pinned, goes into the venv that runs the target: the PostgreSQL drivers (psycopg2 for
# Airflow's sync engine, asyncpg for its async one) and the Celery provider. make test needs none of it.
PG_DRIVERS := psycopg2-binary==2.9.13 asyncpg==0.32.0
# celery 5.6+ dropped celery.backends.database.retry, which this provider version imports: 5.5.3.
CELERY     := apache-airflow-providers-celery==3.26.0 celery==5.5.3 kombu==5.5.4 redis==5.2.1

services:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make system needs:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	  echo "installing Debian's$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed-system: $(STAMP)
	$(BIN)/python -m pip install $(PIP_QUIET) $(PG_DRIVERS) $(CELERY) "apache-airflow==$(AIRFLOW3)"
	@touch $@

# A real Airflow deployment against the simulator, shaped as production runs it (api-server, two schedulers, a
# dag-processor, two triggerers, two Celery workers; PostgreSQL, Redis): the system tests, one per failure scenario
# (tests/system, marked `system`, which `make test` deselects). After pytest's report come the SYS lines: the
# deployment, one line per scenario (seconds billed after the failure, instances alive), and last
# `SYS: <passed>/<total> scenarios pass, <n> instances alive`. Then the browser test of the GPU rentals page (make
# ui-test). Not part of `make test`; about 8 minutes. Some scenarios: `.venv/bin/pytest tests/system -m system -s -k
# "exit3 or mark_failed"`; `--shape small` deploys the LocalExecutor with one scheduler and one triggerer.
SYSTEM_PYTEST := -m system -s -v
system: install services browser $(VENV)/.installed-system $(VENV)/.installed-ui
	$(BIN)/pytest tests/system $(SYSTEM_PYTEST)
	$(BIN)/python -m bench.ui_browser

# Debian's Chromium and its WebDriver for the browser test, installed when missing (apt needs root).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "make ui-test needs chromium and chromedriver (sudo apt-get install chromium chromium-driver)"; exit 1; \
	  fi; \
	  echo "installing Debian's chromium and chromium-driver"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# Selenium drives the browser (pinned: 4.52.0 asks for a certifi release the package index does not have yet).
SELENIUM := selenium==4.50.0
$(VENV)/.installed-ui: $(VENV)/.installed-system
	$(BIN)/python -m pip install $(PIP_QUIET) $(SELENIUM) "apache-airflow==$(AIRFLOW3)"
	@touch $@

# The GPU rentals page and the "GPU rental" link in headless Chromium, on a real Airflow 3.3 deployment (the small
# shape: PostgreSQL, LocalExecutor) with the simulator and the FAB auth manager's login (Admin, Viewer, and two
# teams' per-DAG roles): one UI line per check (bench/ui_browser.py). Not part of `make test`; about 4 minutes.
ui-test: install services browser $(VENV)/.installed-system $(VENV)/.installed-ui
	$(BIN)/python -m bench.ui_browser

# Many jobs at once on one API key, on the same production-shaped deployment: 200 deferred and 20 sync RunJobs with
# the live rate limits on (bench/fleet.py). FLEET lines: leaked, double rentals, 429s, job end -> task success.
# Not part of `make test` or `make system`; about 5 minutes.
fleet: install services $(VENV)/.installed-system
	$(BIN)/python -m bench.fleet

# The deferred scenarios on Airflow 3.2, whose triggerer never calls a trigger's on_kill: a deferred task marked
# failed is destroyed by the trigger's cleanup, which reads the task's state through the Task SDK. The small shape
# (LocalExecutor, one scheduler, one triggerer; PostgreSQL), the tests of those scenarios alone: ~2 minutes.
AIRFLOW32 ?= 3.2.2
VENV32    := .venv-airflow32
STAMP32   := $(VENV32)/.installed-airflow-$(AIRFLOW32)
SYSTEM32_SCENARIOS := deferred_happy or short_job_deferred or mark_failed_deferred or triggerer_restart \
	or exit3_deferred or execution_timeout_deferred

# 3.2.2's api-server does not start with cadwyn 9 and the fastapi it needs (a pydantic "needs a discriminator
# field" error at start-up): pinned to the versions the main venv resolves for 3.3.2.
AIRFLOW32_PINS := cadwyn==7.0.0 fastapi==0.136.3

$(STAMP32): pyproject.toml simulator/pyproject.toml Makefile
	@test -x $(VENV32)/bin/python || $(PYTHON) -m venv $(VENV32)
	$(VENV32)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(VENV32)/bin/python -m pip install $(PIP_QUIET) -e '.[dev]' $(SIM) "apache-airflow==$(AIRFLOW32)" $(AIRFLOW32_PINS) $(PG_DRIVERS)
	@touch $@

system-airflow32: $(STAMP32) services
	$(VENV32)/bin/pytest tests/system $(SYSTEM_PYTEST) --shape small -k "$(SYSTEM32_SCENARIOS)"

# The 2.11 guarantee that works differently there (a deferred task marked failed, seen by the trigger's cleanup),
# on a real 2.11 scheduler and triggerer: SYS2 lines (bench/system_airflow2.py). Not part of `make test`; ~2 min.
system-airflow2: $(STAMP2)
	$(VENV2)/bin/python -m bench.system_airflow2

clean:
	rm -rf $(VENV) $(VENV2) $(VENV32) $(DOCS_VENV) site dist .airflow .pytest_cache .mypy_cache .ruff_cache
