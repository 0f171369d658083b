# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates what it needs (virtual environment, Airflow home, simulator) itself.
SHELL  := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c  # a figure script that fails must fail the target, even behind a grep
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CHAOS_LOG := .airflow/chaos-client/chaos.log

.PHONY: install lint typecheck test test-fast test-airflow2 demo demo-airflow2 bench chaos system system-airflow2 system-airflow32 postgresql clean

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

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[dev]' "apache-airflow==$(AIRFLOW3)"
	@touch $(STAMP)

install: $(STAMP)

$(STAMP2): pyproject.toml Makefile
	@test -x $(VENV2)/bin/python || $(PYTHON) -m venv $(VENV2)
	$(VENV2)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(VENV2)/bin/python -m pip install $(PIP_QUIET) -e '.[dev]' "apache-airflow==$(AIRFLOW2)"
	@touch $@

lint: install
	$(BIN)/ruff check airflow_gpumarket tests example_dags bench scripts

typecheck: install
	$(BIN)/mypy airflow_gpumarket

# Day-to-day: lint, types and the suite on Airflow 3.3.2 only.
test-fast: lint typecheck
	@echo "== tests on Airflow $(AIRFLOW3)"
	$(BIN)/pytest

# The simulator's and the official CLI's suites do not import Airflow: the first leg runs them.
test-airflow2: $(STAMP2)
	@echo "== tests on Airflow $$($(VENV2)/bin/python -c 'import airflow; print(airflow.__version__)')"
	$(VENV2)/bin/pytest --ignore=tests/simulator --ignore=tests/cli

test: test-fast test-airflow2

demo: install
	$(BIN)/python scripts/demo.py

# The same demo on the newest Airflow 2.11.x (its own Airflow home, .airflow/airflow2).
demo-airflow2: $(STAMP2)
	$(VENV2)/bin/python scripts/demo.py

# Figures against the embedded simulator, one line each: NAME: value (goal: ...). Not part of `make test`.
bench: install
	@mkdir -p .airflow/bench
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_simulator.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_triggerer.py
	AIRFLOW_HOME=$(CURDIR)/.airflow/bench $(BIN)/python bench/bench_provider.py 2>/dev/null | grep -E '^P[0-9]'

chaos: install
	@mkdir -p .airflow/chaos-client
	@echo "chaos: about 7 minutes; the whole output goes to $(CHAOS_LOG)"
	@AIRFLOW_HOME=$(CURDIR)/.airflow/chaos-client $(BIN)/python bench/chaos.py > $(CHAOS_LOG) 2>&1 \
	  || { grep -aE '^(R1|    )' $(CHAOS_LOG); echo "make chaos FAILED; last lines of $(CHAOS_LOG):"; \
	       tail -n 40 $(CHAOS_LOG); exit 1; }
	@grep -aE '^(R1|    )' $(CHAOS_LOG)

# make system's metadata database is PostgreSQL, as in production: Debian's package, installed when missing (apt
# needs root), run by bench/postgres.py from a temporary folder on a loopback port and removed afterwards. Airflow
# reaches it through psycopg2 and, on Airflow 3, asyncpg, pinned and installed into the venv that runs the target.
PG_DRIVERS := psycopg2-binary==2.9.13 asyncpg==0.32.0

postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" != 0 ]; then echo "make system needs PostgreSQL: sudo apt-get install postgresql"; exit 1; fi; \
	  echo "installing Debian's postgresql package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	fi

$(VENV)/.installed-pg-drivers: $(STAMP)
	$(BIN)/python -m pip install $(PIP_QUIET) $(PG_DRIVERS)
	@touch $@

# A real Airflow deployment (api-server, scheduler, dag-processor, triggerer; LocalExecutor, PostgreSQL) against
# the simulator: one SYS line per failure scenario (bench/system.py). Not part of `make test`; about 3 minutes.
system: install postgresql $(VENV)/.installed-pg-drivers
	$(BIN)/python bench/system.py

# The deferred scenarios on Airflow 3.2, whose triggerer never calls a trigger's on_kill: a deferred task marked
# failed is destroyed by the trigger's cleanup, which reads the task's state through the Task SDK. ~2 minutes.
AIRFLOW32 ?= 3.2.2
VENV32    := .venv-airflow32
STAMP32   := $(VENV32)/.installed-airflow-$(AIRFLOW32)
SYSTEM32_SCENARIOS := deferred_happy,short_job_deferred,mark_failed_deferred,triggerer_restart,exit3_deferred,execution_timeout_deferred

# 3.2.2's api-server does not start with cadwyn 9 and the fastapi it needs (a pydantic "needs a discriminator
# field" error at start-up): pinned to the versions the main venv resolves for 3.3.2.
AIRFLOW32_PINS := cadwyn==7.0.0 fastapi==0.136.3

$(STAMP32): pyproject.toml Makefile
	@test -x $(VENV32)/bin/python || $(PYTHON) -m venv $(VENV32)
	$(VENV32)/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	$(VENV32)/bin/python -m pip install $(PIP_QUIET) -e '.[dev]' "apache-airflow==$(AIRFLOW32)" $(AIRFLOW32_PINS) $(PG_DRIVERS)
	@touch $@

system-airflow32: $(STAMP32) postgresql
	$(VENV32)/bin/python bench/system.py --scenarios $(SYSTEM32_SCENARIOS)

# The 2.11 guarantee that works differently there (a deferred task marked failed, seen by the trigger's cleanup),
# on a real 2.11 scheduler and triggerer: SYS2 lines (bench/system_airflow2.py). Not part of `make test`; ~2 min.
system-airflow2: $(STAMP2)
	$(VENV2)/bin/python bench/system_airflow2.py

clean:
	rm -rf $(VENV) $(VENV2) $(VENV32) .airflow .pytest_cache .mypy_cache .ruff_cache
