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


def test_the_plugin_every_airflow_process_loads_imports_neither_the_page_nor_the_hook():
    """Airflow's plugin manager imports the plugin in schedulers, workers and triggerers too: the page's app
    (FastAPI routes, the hook, the database reads) is built only by the api-server's first request to it."""
    code = (
        "import sys; import airflow_gpumarket.ui.plugin as p; "
        "assert p.GpuMarketPlugin.fastapi_apps[0]['url_prefix'] == '/gpumarket'; "
        "loaded = [m for m in ('airflow_gpumarket.ui.app', 'airflow_gpumarket.hooks.gpumarket', 'fastapi') "
        "if m in sys.modules]; print('loaded:', loaded)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "loaded: []" in result.stdout.splitlines(), result.stdout + result.stderr


def test_the_simulators_server_is_an_extra_not_a_runtime_dependency():
    requirements = DIST.requires or []
    server = [r for r in requirements if r.split(">")[0].split("=")[0].strip() in ("fastapi", "uvicorn")]
    assert server and all('extra == "simulator"' in r or 'extra == "dev"' in r for r in server)
    assert {"simulator", "dev"} <= set(DIST.metadata.get_all("Provides-Extra") or [])
