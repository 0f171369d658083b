"""The retry policy example on the simulator: a job that exits 3 fails at once, a job with no working offer is
retried after the policy's delay (Airflow 3.3+)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from airflow_gpumarket._compat import has_retry_policies
from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer

from .conftest import alive, task_states

pytestmark = pytest.mark.skipif(not has_retry_policies(), reason="retry policies are Airflow 3.3+'s")


def test_rule_under_the_policy_a_job_that_exits_3_fails_at_once(example_dag, sim, task_log):
    run = example_dag("example_gpumarket_retry_policy").test(run_conf={"command": "echo epoch 1; exit 3"})
    (ti,) = run.get_task_instances()
    assert run.state == "failed" and ti.state == "failed", task_states(run)  # not up_for_retry, with retries=3
    assert ti.try_number == 1 and ti.max_tries == 3
    assert "the job itself failed: a new GPU would run it the same way" in task_log()
    assert len(sim.state()["instances"]) == 1 and alive(sim) == []


def test_rule_under_the_policy_a_job_whose_hosts_all_fail_is_retried_after_the_delay(example_dag, sim):
    from airflow.sdk import RetryAction

    for offer in sim.state()["offers"]:
        sim.set_offer_fate(offer["id"], "offline")  # every host fails before the job starts
    task = example_dag("example_gpumarket_retry_policy").get_task("train")
    task.command = "echo never runs"
    with pytest.raises(GpuMarketNoWorkingOffer, match="Could not get a working instance") as failed:
        task.execute({"run_id": "run-1", "ti": SimpleNamespace(try_number=1, map_index=-1)})
    decision = task.retry_policy.evaluate(failed.value, try_number=1, max_tries=task.retries + 1)
    assert decision.action is RetryAction.RETRY and decision.retry_delay == timedelta(minutes=10)
    assert alive(sim) == []
