"""Fixtures of the simulator's own tests: a frozen-clock simulator (time moves only through ``advance``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpumarket_simulator import MarketSimulator

from .helpers import Api

SEED = 0


@pytest.fixture(scope="session")
def sim_server() -> Iterator[MarketSimulator]:
    # The spec rules are tested on the spec profile; the live profile has its own file (test_sim_live.py).
    with MarketSimulator(speed=0, seed=SEED, profile="spec") as sim:
        yield sim


@pytest.fixture
def sim(sim_server: MarketSimulator) -> MarketSimulator:
    sim_server.reset()
    return sim_server


@pytest.fixture
def api(sim: MarketSimulator) -> Api:
    return Api(sim, sim.api_key)
