# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates what it needs (virtual environment, Airflow home, simulator) itself.
SHELL  := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c  # a figure script that fails must fail the target, even behind a grep
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CHAOS_LOG := .airflow/chaos-client/chaos.log

.PHONY: install lint typecheck test test-airflow2 demo bench chaos system clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check airflow_gpumarket tests example_dags bench scripts

typecheck: install
	$(BIN)/mypy airflow_gpumarket

test: lint typecheck
	$(BIN)/pytest

# Airflow 2.11 support is under way (issue 14): the same tests on the newest Airflow 2.11.x, in a virtual
# environment of their own (the simulator's and the official CLI's suites do not depend on Airflow: run once).
VENV2     := .venv-airflow2
AIRFLOW2  ?= 2.11.*
$(VENV2)/.installed: pyproject.toml
	@test -x $(VENV2)/bin/python || $(PYTHON) -m venv $(VENV2)
	$(VENV2)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(VENV2)/bin/python -m pip install --quiet --disable-pip-version-check "apache-airflow==$(AIRFLOW2)" \
	  "apache-airflow-providers-common-compat>=1.23" "fastapi>=0.110" "uvicorn>=0.27" "pytest>=8" "requests-mock>=1.11"
	$(VENV2)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

test-airflow2: $(VENV2)/.installed
	$(VENV2)/bin/pytest --ignore=tests/simulator --ignore=tests/cli

demo: install
	$(BIN)/python scripts/demo.py

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

# A real Airflow deployment (api-server, scheduler, dag-processor, triggerer; LocalExecutor) against the simulator:
# one SYS line per failure scenario (bench/system.py). Not part of `make test`; about 3 minutes.
system: install
	$(BIN)/python bench/system.py

clean:
	rm -rf $(VENV) $(VENV2) .airflow .pytest_cache .mypy_cache .ruff_cache
