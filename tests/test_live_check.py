"""The live acceptance suite (tests/live) kept working: run against the simulator as `make live-check-sim` runs it.

Each test runs scripts/live_check_sim.py in a subprocess (the simulator at 60x, polls of 0.2 s), which ends by
reading the simulator's own state: ``SIM: <n> instance(s) rented, <m> alive``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live.acceptance import ASSUMPTIONS, CAP_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
REFUSED_EXIT = 3
LIVE_DOC = ROOT / "docs" / "reference" / "live-service.md"


def live_check_sim(**variables: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUMARKET_LIVE_")}
    env.update(variables)
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "live_check_sim.py"), "--speed", "60", "--poll-interval", "0.2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


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

    from tests.live.acceptance import airflow_connections

    given, wrong = airflow_connections(conn).values()
    parse = Connection.from_json if conn.startswith("{") else lambda text: Connection(uri=text)
    assert given == conn
    assert parse(wrong).host == parse(conn).host and parse(wrong).password not in ("", "k3y")
