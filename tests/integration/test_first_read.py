"""A fresh rental's first log read shows the job's lines as they are, with no note about a restart that never was."""

from __future__ import annotations

import pytest

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

from .conftest import alive
from .test_interruptible import run_to_the_end
from .test_money_safety import FILTERS, context

#: Longer than the simulator's boot (1 to 5 simulated minutes, at most 0.5 s here): the first read finds it running.
FIRST_READ_AFTER = 1.0


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_rule_a_fresh_job_whose_first_read_finds_it_running_is_not_called_resumed(sim, task_log, deferrable):
    op = GpuMarketRunJobOperator(
        task_id="job",
        offer_filters=FILTERS,
        image="img",
        command="echo first-line; sleep 2; echo second-line",  # running at the first read
        deferrable=deferrable,
        poll_interval=FIRST_READ_AFTER,
        log_interval=5,
    )
    if deferrable:
        run_to_the_end(op)
    else:
        op.execute(context())
    text = task_log()
    assert "first-line" in text and "second-line" in text
    assert "already running" not in text
    assert alive(sim) == []
