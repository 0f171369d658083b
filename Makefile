# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates what it needs (virtual environment, Airflow home, simulator) itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lint typecheck test demo clean

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

demo: install
	$(BIN)/python scripts/demo.py

clean:
	rm -rf $(VENV) .airflow .pytest_cache .mypy_cache .ruff_cache
