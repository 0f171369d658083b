"""GpuMarketCreateInstanceOperator (operators/create_instance.py): an instance rented and handed to the DAG."""

from __future__ import annotations

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator

from .renting_fakes import FakeHook, ctx


def test_create_instance_operator_hands_over_a_running_instance_without_destroying_it():
    hook = FakeHook({1: [None, "running"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", poll_interval=0.001
    )
    op.__dict__["hook"] = hook
    hook.get_instance = lambda instance_id: {"ssh_host": "h", "ssh_port": 22}
    result = op.execute(ctx())
    assert result["instance_id"] == 1001 and hook.destroyed == []
    assert op._guard.instance_id is None  # a later on_kill has nothing of its own to destroy
