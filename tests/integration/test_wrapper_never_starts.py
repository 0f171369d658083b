"""A job whose onstart script never runs (a simulator that does not execute it) fails over, never waits max_runtime."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

from .test_interruptible import run_to_the_end
from .test_money_safety import FILTERS, context


@pytest.fixture
def sim_without_onstart(monkeypatch):
    from gpumarket_simulator import MarketSimulator

    with MarketSimulator(speed=600, seed=11, execute_onstart=False) as sim:
        for name, value in sim.connection_env().items():
            conn = json.loads(value)
            conn["extra"] |= {"retry_min_wait": 0.01, "retry_max_wait": 0.05, "timeout": 2}
            monkeypatch.setenv(name, json.dumps(conn))
        yield sim


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_a_job_whose_wrapper_never_starts_fails_over_naming_why_and_leaves_nothing(
    sim_without_onstart, deferrable
):
    op = GpuMarketRunJobOperator(
        task_id="job",
        offer_filters=FILTERS,
        image="img",
        command="echo hello",
        max_runtime=6 * 3600,  # hours of the simulator's clock: the task must not wait for it
        max_offer_attempts=2,
        poll_interval=0.05,
        log_interval=0.05,
        deferrable=deferrable,
    )
    with pytest.raises(GpuMarketNoWorkingOffer) as caught:
        run_to_the_end(op) if deferrable else op.execute(context())
    message = str(caught.value)
    assert "never started" in message and "no line of the provider's job wrapper" in message
    assert "--execute-onstart" in message  # the simulator's own log line, quoted
    rented = sim_without_onstart.state()["instances"]
    assert len(rented) == 2 and sim_without_onstart.alive_instances() == []
    assert all(i["compute_seconds"] < 3600 for i in rented), rented
