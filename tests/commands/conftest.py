"""The ``airflow gpumarket`` commands against the embedded simulator: the integration tests' simulator and DAGs."""

from __future__ import annotations

import json
import re

import pytest
from integration import conftest as integration

from airflow_gpumarket.__main__ import main

# The integration tests' simulator (600x, onstart executed), its per-test reset, their DAGs and the secrets check.
job_sim_server = integration.job_sim_server
sim = integration.sim
example_dag = integration.example_dag
no_secret_leaks = integration.no_secret_leaks


#: The start of a log record's line, as Airflow 3 (``2026-11-28T09:29:21.736424Z [warning ...``) and 2.11
#: (``[2026-11-28T09:29:21.736+0000] {core.py:238} WARNING ...``) print them.
LOG_LINE = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}")


def without_logs(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not LOG_LINE.match(line))


def forget_service_reads() -> None:
    """The commands read through the page's sources, which reuse a listing for seconds: not across tests."""
    from airflow_gpumarket.ui import sources

    for cache in (sources._listings, sources._charges, sources._accounts):
        cache.clear()


@pytest.fixture
def run(capsys, airflow_db):
    """Run one command in this process as ``python -m airflow_gpumarket`` does: (exit code, stdout, stderr).

    Log records (the hook's "Try 1 failed; retrying" while a service is down) go where Airflow's logging sends them,
    stdout on Airflow 3: they are left out here, so what is checked is what the command itself printed.
    """

    def run_command(*argv: str) -> tuple[int, str, str]:
        forget_service_reads()
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, without_logs(out), without_logs(err)

    return run_command


@pytest.fixture
def connection(sim, monkeypatch):
    """Define connection ``name`` as the simulator's with other fields: ``connection("bad", password="x")``."""
    (value,) = sim.connection_env().values()

    def define(name: str, **fields) -> str:
        conn = json.loads(value)
        conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "max_retries": 2}
        conn |= fields
        monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps(conn))
        return name

    return define
