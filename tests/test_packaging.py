"""What installing the provider brings into a user's environment (from the installed distribution's metadata)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution

DIST = distribution("airflow-provider-gpumarket")


def test_installing_the_provider_adds_nothing_to_anyones_pytest():
    # The simulator's fixture is opt-in (pytest_plugins or -p), as official providers ship no pytest11 plugin.
    groups = {entry_point.group for entry_point in DIST.entry_points}
    assert "pytest11" not in groups
    assert groups == {"apache_airflow_provider", "airflow.plugins", "console_scripts"}


def assert_loads_none(code: str) -> None:
    """Run ``code`` in a fresh interpreter; it prints ``loaded: [...]``, the modules it must not have imported."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "loaded: []" in result.stdout.splitlines(), result.stdout + result.stderr


def test_the_plugin_every_airflow_process_loads_imports_neither_the_page_nor_the_hook():
    """Airflow's plugin manager imports the plugin in schedulers, workers and triggerers too: the page's app
    (FastAPI routes, the hook, the database reads) is built only by the api-server's first request to it."""
    code = (
        "import sys; import airflow_gpumarket.ui.plugin as p; "
        "assert p.GpuMarketPlugin.fastapi_apps[0]['url_prefix'] == '/gpumarket'; "
        "loaded = [m for m in ('airflow_gpumarket.ui.app', 'airflow_gpumarket.hooks.gpumarket', 'fastapi') "
        "if m in sys.modules]; print('loaded:', loaded)"
    )
    assert_loads_none(code)


def test_a_dag_file_with_renting_operators_and_sensors_imports_only_what_parsing_needs():
    """The wait's state machine, the log reader and the hook are imported when a task runs, not by every parse."""
    code = (
        "import sys; from datetime import datetime; from airflow.providers.common.compat.sdk import DAG; "
        "from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator; "
        "from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator; "
        "from airflow_gpumarket.sensors.instances import GpuMarketInstanceStatusSensor; "
        "dag = DAG('d', start_date=datetime(2026, 1, 1), schedule=None)\n"
        "with dag:\n"
        "    GpuMarketRunJobOperator(task_id='j', command='true', image='i', offer_filters={}, interruptible=True)\n"
        "    GpuMarketCreateInstanceOperator(task_id='c', offer_id=1, image='i')\n"
        "    GpuMarketInstanceStatusSensor(task_id='s', instance_id=3)\n"
        "runtime = ('lifecycle', 'waiting', 'job_logs', 'python_job', 'hooks.gpumarket', 'triggers.instances')\n"
        "print('loaded:', [m for m in runtime if 'airflow_gpumarket.' + m in sys.modules])"
    )
    assert_loads_none(code)


def test_the_simulators_server_is_an_extra_not_a_runtime_dependency():
    requirements = DIST.requires or []
    server = [r for r in requirements if r.split(">")[0].split("=")[0].strip() in ("fastapi", "uvicorn")]
    assert server and all('extra == "simulator"' in r or 'extra == "dev"' in r for r in server)
    assert {"simulator", "dev"} <= set(DIST.metadata.get_all("Provides-Extra") or [])
