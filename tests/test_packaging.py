"""What installing the provider brings into a user's environment (from the installed distribution's metadata)."""

from __future__ import annotations

from importlib.metadata import distribution

DIST = distribution("airflow-provider-gpumarket")


def test_installing_the_provider_adds_nothing_to_anyones_pytest():
    # The simulator's fixture is opt-in (pytest_plugins or -p), as official providers ship no pytest11 plugin.
    groups = {entry_point.group for entry_point in DIST.entry_points}
    assert "pytest11" not in groups
    assert groups == {"apache_airflow_provider", "console_scripts"}


def test_the_simulators_server_is_an_extra_not_a_runtime_dependency():
    requirements = DIST.requires or []
    server = [r for r in requirements if r.split(">")[0].split("=")[0].strip() in ("fastapi", "uvicorn")]
    assert server and all('extra == "simulator"' in r or 'extra == "dev"' in r for r in server)
    assert {"simulator", "dev"} <= set(DIST.metadata.get_all("Provides-Extra") or [])
