"""The commands' two entry points, as a terminal runs them, and what loading them costs Airflow's CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from airflow_gpumarket.commands.definition import COMMANDS

AIRFLOW_2 = version("apache-airflow").startswith("2.")
NAMES = [command.name for command in COMMANDS]


def terminal(*argv: str) -> subprocess.CompletedProcess:
    """Run a command in a fresh interpreter, with this test run's Airflow home and connections (its environment)."""
    return subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy(), timeout=120)


@pytest.mark.skipif(AIRFLOW_2, reason="Airflow 2.11's CLI reads no provider commands: python -m airflow_gpumarket")
def test_airflow_gpumarket_help_through_airflows_own_cli():
    airflow = Path(sys.executable).with_name("airflow")
    done = terminal(str(airflow), "gpumarket", "--help")
    assert done.returncode == 0, done.stderr
    assert "GPU Market: check a connection, list rentals and orphans, read spend" in done.stdout
    assert all(name in done.stdout for name in NAMES)
    done = terminal(str(airflow), "gpumarket", "spend", "--help")
    assert done.returncode == 0 and "--month" in done.stdout and "--conn-id" in done.stdout


def test_the_fallback_runs_the_same_commands(sim):
    done = terminal(sys.executable, "-m", "airflow_gpumarket", "--help")
    assert done.returncode == 0 and all(name in done.stdout for name in NAMES)
    done = terminal(sys.executable, "-m", "airflow_gpumarket", "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU Market doctor: connection 'gpumarket_default'" in done.stdout and "0 failed" in done.stdout
    assert sim.api_key not in done.stdout + done.stderr
    done = terminal(sys.executable, "-m", "airflow_gpumarket", "orphans", "--destroy", "--bogus")
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr


def test_airflows_cli_loads_the_commands_without_importing_them():
    """Airflow imports the provider info's ``cli`` function whenever its CLI starts, for any command."""
    heavy = ("hooks.gpumarket", "ui.sources", "commands.common", "commands.doctor", "commands.rentals")
    code = "\n".join(
        [
            "import sys",
            "from importlib import import_module",
            "from airflow_gpumarket.get_provider_info import get_provider_info",
            "(path,) = get_provider_info()['cli']",
            "module, _, name = path.rpartition('.')",
            "(group,) = getattr(import_module(module), name)()",
            f"assert group.name == 'gpumarket' and [c.name for c in group.subcommands] == {NAMES!r}",
            f"heavy = {['airflow_gpumarket.' + m for m in heavy] + ['gpumarket_simulator', 'fastapi']!r}",
            "print('loaded:', [m for m in heavy if m in sys.modules])",
        ]
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "loaded: []" in done.stdout.splitlines(), done.stdout + done.stderr
