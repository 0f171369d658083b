"""The ``airflow gpumarket`` commands in the deployment, as an operator runs them on one of its machines.

Its PostgreSQL metadata database, its connection to the simulator (rate limits on) and its Airflow home: the same
environment its components run with.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from .deployment import BIN
from .scenario import SystemDeployment

pytestmark = pytest.mark.system


def gpumarket(deployment: SystemDeployment, *argv: str) -> subprocess.CompletedProcess:
    command = [str(BIN / "airflow"), "gpumarket", *argv]
    return subprocess.run(command, env=deployment.env, capture_output=True, text=True, timeout=180, check=False)


def test_doctor_rentals_orphans_and_spend_answer_in_the_deployment(deployment: SystemDeployment):
    doctor = gpumarket(deployment, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "0 failed" in doctor.stdout and deployment.simulator.url in doctor.stdout
    assert re.search(r"^ok\s+api-server\s+provider \S+, Airflow 3", doctor.stdout, re.M), doctor.stdout
    rentals = gpumarket(deployment, "rentals")
    assert rentals.returncode == 0 and "live rental" in rentals.stdout, rentals.stdout + rentals.stderr
    orphans = gpumarket(deployment, "orphans")
    assert orphans.returncode == 0, orphans.stdout + orphans.stderr
    spend = gpumarket(deployment, "spend", "--month")
    assert spend.returncode == 0 and "GPU Market spend from" in spend.stdout, spend.stdout + spend.stderr
    unknown = gpumarket(deployment, "rentals", "--conn-id", "no_such_connection")
    assert unknown.returncode == 2 and "is not defined" in unknown.stderr
