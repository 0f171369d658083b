"""pytest plugin, opt-in: the ``gpumarket_sim`` fixture.

Installing the simulator loads nothing into anyone's pytest. A project that wants the fixture says so, in its
top-level ``conftest.py`` (``pytest_plugins = ["gpumarket_simulator.pytest_plugin"]``) or on the command
line (``-p gpumarket_simulator.pytest_plugin``). The module imports nothing heavy: the simulator starts
(and FastAPI and uvicorn are imported) only when a test asks for the fixture.

- ``gpumarket_sim_server`` (session): one simulator for the whole run.
- ``gpumarket_sim`` (function): that simulator, freshly reset, with ``AIRFLOW_CONN_GPUMARKET_DEFAULT`` set for
  the test. ``@pytest.mark.gpumarket_sim(speed=..., seed=..., execute_onstart=..., world=..., profile=...,
  rate_limits=...)`` gives the test
  a dedicated simulator with those settings instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gpumarket_simulator.server import MarketSimulator


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpumarket", "gpumarket simulator")
    group.addoption(
        "--gpumarket-sim-speed",
        type=float,
        default=None,
        help="simulated seconds per real second of the gpumarket_sim fixture (default 60)",
    )
    group.addoption("--gpumarket-sim-seed", type=int, default=None, help="world seed of gpumarket_sim (default 0)")
    group.addoption(
        "--gpumarket-sim-profile",
        choices=("live", "spec"),
        default=None,
        help="profile of gpumarket_sim: live (default) or spec",
    )
    group.addoption(
        "--gpumarket-sim-execute-onstart",
        action="store_true",
        default=False,
        help="let gpumarket_sim run onstart scripts as local processes",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpumarket_sim(**kwargs): give this test its own simulator, built with MarketSimulator(**kwargs)",
    )


def _options(config: pytest.Config) -> dict[str, Any]:
    speed = config.getoption("--gpumarket-sim-speed")
    seed = config.getoption("--gpumarket-sim-seed")
    return {
        "speed": 60.0 if speed is None else speed,
        "seed": 0 if seed is None else seed,
        "execute_onstart": bool(config.getoption("--gpumarket-sim-execute-onstart")),
        "profile": config.getoption("--gpumarket-sim-profile") or "live",
    }


@pytest.fixture(scope="session")
def gpumarket_sim_server(request: pytest.FixtureRequest) -> Iterator[MarketSimulator]:
    from gpumarket_simulator.server import MarketSimulator

    sim = MarketSimulator(**_options(request.config)).start()
    try:
        yield sim
    finally:
        sim.close()


@pytest.fixture
def gpumarket_sim(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[MarketSimulator]:
    marker = request.node.get_closest_marker("gpumarket_sim")
    if marker is not None and marker.kwargs:
        from gpumarket_simulator.server import MarketSimulator

        sim = MarketSimulator(**{**_options(request.config), **marker.kwargs}).start()
        owned = True
    else:
        sim = request.getfixturevalue("gpumarket_sim_server")
        sim.reset()
        owned = False
    for name, value in sim.connection_env().items():
        monkeypatch.setenv(name, value)
    try:
        yield sim
    finally:
        if owned:
            sim.close()
