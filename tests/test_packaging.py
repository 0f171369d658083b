"""What installing the provider, or the simulator, brings into a user's environment (from the installed metadata)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import distribution

DIST = distribution("airflow-provider-gpumarket")
SIMULATOR = distribution("gpumarket-simulator")


def test_installing_the_provider_or_the_simulator_adds_nothing_to_anyones_pytest():
    # The simulator's fixture is opt-in (pytest_plugins or -p), as official providers ship no pytest11 plugin.
    assert {entry_point.group for entry_point in DIST.entry_points} == {"apache_airflow_provider", "airflow.plugins"}
    assert {entry_point.group for entry_point in SIMULATOR.entry_points} == {"console_scripts"}


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
        "runtime = ('lifecycle', 'waiting', 'job_logs', 'python_job', 'hooks.gpumarket', 'triggers.instances',\n"
        "           'metrics', 'lineage', 'assets', 'operators.failures', 'ui.links', 'operators.session')\n"
        "loaded = [m for m in runtime if 'airflow_gpumarket.' + m in sys.modules]\n"
        "others = ('gpumarket_simulator', 'fastapi', 'openlineage', 'airflow.providers.openlineage.extractors')\n"
        "print('loaded:', loaded + [m for m in others if m in sys.modules])"
    )
    assert_loads_none(code)


def test_a_dag_file_with_the_spend_report_and_the_credit_watch_imports_neither_the_hook_nor_the_ledger():
    code = (
        "import sys; from datetime import datetime; from airflow.providers.common.compat.sdk import DAG; "
        "from airflow_gpumarket.notifications.credit import GpuMarketLowCreditNotifier; "
        "from airflow_gpumarket.operators.spend_report import GpuMarketSpendReportOperator; "
        "from airflow_gpumarket.sensors.credit import GpuMarketCreditSensor; "
        "dag = DAG('d', start_date=datetime(2026, 1, 1), schedule=None)\n"
        "with dag:\n"
        "    GpuMarketSpendReportOperator(task_id='r', on_success_callback=GpuMarketLowCreditNotifier(threshold=5))\n"
        "    GpuMarketCreditSensor(task_id='s', threshold=5, runway_days=3, mode='reschedule')\n"
        "runtime = ('hooks.gpumarket', 'operators.budget', 'ledger')\n"
        "loaded = [m for m in runtime if 'airflow_gpumarket.' + m in sys.modules]\n"
        "print('loaded:', loaded + [m for m in ('gpumarket_simulator', 'fastapi') if m in sys.modules])"
    )
    assert_loads_none(code)


def requirement_names(dist) -> set[str]:
    return {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower() for r in dist.requires or []}


def test_the_simulator_is_a_distribution_of_its_own_not_a_dependency_of_the_provider():
    assert requirement_names(DIST).isdisjoint({"gpumarket-simulator", "fastapi", "uvicorn"})
    assert set(DIST.metadata.get_all("Provides-Extra") or []) == {"dev"}
    assert {"fastapi", "uvicorn"} <= requirement_names(SIMULATOR)
    assert "apache-airflow" not in requirement_names(SIMULATOR)


def test_the_module_airflows_example_dag_discovery_imports_loads_nothing():
    code = (
        "import sys; import airflow_provider_gpumarket as m; assert not hasattr(m, '__path__'); "
        "print('loaded:', [name for name in sys.modules if name.split('.')[0] in ('airflow', 'airflow_gpumarket')])"
    )
    assert_loads_none(code)
