"""The live acceptance suite (tests/live) kept working: run against the simulator, in a subprocess.

``live_check_sim`` runs it as `make live-check-sim` does (scripts/live_check_sim.py, the simulator at 60x, polls of
0.2 s), which ends by reading the simulator's own state: ``SIM: <n> instance(s) rented, <m> alive``. ``live_suite``
runs it against a simulator of the test's own, to shape what the service answers.

The suite is an operator's tool that `make live-check` runs in the main environment: these tests run on Airflow 3
only, where that environment is (the provider code they reach is the same on 2.11, whose leg tests it elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from live.acceptance import ASSUMPTIONS, CAP_VARIABLE

from airflow_gpumarket._compat import is_airflow_2

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="make live-check runs in the Airflow 3 environment")

ROOT = Path(__file__).resolve().parent.parent
REFUSED_EXIT = 3
LIVE_DOC = ROOT / "docs" / "reference" / "live-service.md"


def run(command: list[str], variables: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` run in the checkout, in this environment less its live-run variables, plus ``variables``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMARKET_LIVE_")}
    return subprocess.run(command, cwd=ROOT, env=env | variables, capture_output=True, text=True, timeout=300)


def live_check_sim(**variables: str) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "scripts" / "live_check_sim.py")
    return run([sys.executable, script, "--speed", "60", "--poll-interval", "0.2"], variables)


def test_the_live_suite_passes_against_the_simulator_and_leaves_nothing_alive():
    done = live_check_sim()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lines = re.findall(r"^LIVE (held|differs|skipped): .*$", output, re.M)
    assert len(lines) == len(ASSUMPTIONS), output[-4000:]
    assert set(lines) == {"held"}, output[-4000:]
    assert "SIM: 2 instance(s) rented, 0 alive" in output, output[-4000:]


@pytest.mark.parametrize(
    "cap",
    [
        pytest.param("0", id="zero"),
        pytest.param("", id="empty"),
        pytest.param("0.0001", id="below-the-worst-case"),
    ],
)
def test_the_live_suite_refuses_to_start_without_a_cap_that_covers_its_worst_case(cap):
    done = live_check_sim(**{CAP_VARIABLE: cap})
    output = done.stdout + done.stderr
    assert done.returncode == REFUSED_EXIT, output[-4000:]
    assert "live-check refused" in output and "Nothing was rented" in output, output[-4000:]
    assert "SIM: 0 instance(s) rented, 0 alive" in output, output[-4000:]


def live_suite(sim, **variables: str) -> subprocess.CompletedProcess[str]:
    """The suite run against an in-process simulator, with retries that wait milliseconds."""
    conn = json.loads(sim.connection_env()["AIRFLOW_CONN_GPUMARKET_DEFAULT"])
    conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "max_retries": 2}
    variables = {"GPUMARKET_LIVE_CONN": json.dumps(conn), "GPUMARKET_LIVE_POLL_INTERVAL": "0.2", **variables}
    return run([sys.executable, "-m", "pytest", "tests/live", "-m", "live", "-p", "no:cacheprovider"], variables)


def test_findings_are_reported_and_do_not_fail_the_run():
    from gpumarket_simulator import MarketSimulator

    # The spec profile has none of the live service's extras: v1 list, users/current, charges, invoices.
    with MarketSimulator(speed=60, seed=3, execute_onstart=True, profile="spec") as sim:
        done = live_suite(sim)
        alive = sim.alive_instances()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    differs = re.findall(r"^LIVE differs: (.*)$", output, re.M)
    assert any("GET /api/v0/charges/" in line for line in differs), output[-4000:]
    assert alive == []


def test_a_critical_assumption_that_differs_fails_the_run_before_anything_is_rented():
    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=60, seed=3, execute_onstart=True) as sim:
        sim.set_faults([{"kind": "status", "endpoint": "search_offers", "status": 500}])
        done = live_suite(sim)
        rented = sim.state()["instances"]
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert re.search(r"^LIVE differs: a search answers priced offers", output, re.M), output[-4000:]
    assert "FAILED tests/live/test_live_service.py::test_the_live_service_holds[search]" in output
    assert rented == []


def test_the_docs_list_every_assumption_the_live_suite_reports_on():
    section = LIVE_DOC.read_text().partition("## The live acceptance run")[2]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M)
    assert listed == [assumption.id for assumption in ASSUMPTIONS]
    critical = re.findall(r"^\| `([a-z0-9-]+)` \| yes \|", section, re.M)
    assert critical == [assumption.id for assumption in ASSUMPTIONS if assumption.critical]


@pytest.mark.parametrize(
    "conn",
    [
        pytest.param('{"conn_type": "gpumarket", "host": "https://api.example", "password": "k3y"}', id="json"),
        pytest.param("gpumarket://:k3y@api.example?rate_limit_scale=1", id="uri"),
    ],
)
def test_the_live_suite_reads_a_connection_in_json_or_uri_form_and_makes_a_wrong_key_of_it(conn):
    from airflow.models.connection import Connection
    from live.acceptance import airflow_connections

    given, wrong = airflow_connections(conn).values()
    parse = Connection.from_json if conn.startswith("{") else lambda text: Connection(uri=text)
    assert given == conn
    assert parse(wrong).host == parse(conn).host and parse(wrong).password not in ("", "k3y")
