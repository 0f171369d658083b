"""GpuMarketCreateInstanceOperator (operators/create_instance.py): an instance rented and handed to the DAG."""

from __future__ import annotations

import time

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket import lifecycle
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.failures import GpuMarketJobFailed

from .renting_fakes import FakeHook, ctx

OK = {"offer_filters": {"gpu_name": {"eq": "RTX 4090"}}, "image": "pytorch/pytorch"}
CREATE = GpuMarketCreateInstanceOperator

CASES = [
    # (operator, arguments, the argument the message must name)
    (CREATE, {**OK, "lease": 0}, "lease"),
]


def test_create_instance_operator_hands_over_a_running_instance_without_destroying_it():
    hook = FakeHook({1: [None, "running"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", poll_interval=0.001
    )
    op.__dict__["hook"] = hook
    hook.get_instance = lambda instance_id: {"ssh_host": "h", "ssh_port": 22}
    result = op.execute(ctx())
    assert result["instance_id"] == 1001 and hook.destroyed == []
    op.on_kill()
    assert hook.destroyed == []  # handed over: a later on_kill has nothing of its own to destroy


def test_rule_a_command_that_exits_before_its_instance_is_seen_running_fails_the_task_and_rents_nothing_more():
    """The job wrapper stopped the instance between two reads: the command's exit, not a failed host to fail over."""
    hook = FakeHook({1: [None, "stopped"], 2: ["running"]})
    hook.log_text = "gpumarket: job started\nno model here\ngpumarket: job exited with status 3\n"
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", command="serve", poll_interval=0.001
    )
    op.__dict__["hook"] = hook
    with pytest.raises(GpuMarketJobFailed, match="exited before the instance was seen running") as failed:
        op.execute(ctx())
    assert failed.value.exit_status == 3 and "no model here" in str(failed.value)
    assert list(hook.instances) == [1001] and hook.destroyed == [1001]


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def test_without_waiting_for_running_the_instance_is_handed_over_right_after_its_creation():
    hook = FakeHook({1: [None, "running"]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create", offer_filters={"num_gpus": {"gte": 1}}, image="img", wait_for_running=False
    )
    op.__dict__["hook"] = hook
    result = op.execute(ctx())
    assert (
        result["instance_id"] == 1001 and hook.destroyed == [] and hook.reads[1001] == [None, "running"]
    )  # never read
    op.on_kill()
    assert hook.destroyed == []


def test_without_waiting_for_running_a_retry_returns_right_after_adopting_an_earlier_tries_instance():
    """wait_for_running=False: a retry that adopts a booting instance of an earlier try reads no status either."""
    hook = FakeHook({1: [None]})
    op = GpuMarketCreateInstanceOperator(
        task_id="create",
        offer_filters={"num_gpus": {"gte": 1}},
        image="img",
        wait_for_running=False,
        poll_interval=0.001,
        boot_timeout=0.05,
    )
    op.__dict__["hook"] = hook
    earlier = hook.create_instance(1, label=lifecycle.make_label(task_key(op, ctx()), time.time() + 3600))
    hook.instances[earlier["new_contract"]]["actual_status"] = "loading"
    result = op.execute(ctx(2))
    assert result["instance_id"] == 1001 and list(hook.instances) == [1001]
    assert hook.reads[1001] == [None] and hook.destroyed == []  # never read: the script was not consumed
