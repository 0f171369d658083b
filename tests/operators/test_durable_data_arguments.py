"""The durable-data arguments of the renting operators: checked when the DAG is parsed, templated when rendered."""

from __future__ import annotations

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

COMMON = {"offer_filters": {"num_gpus": {"eq": 1}}, "image": "img"}


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"checkpoint_dir": "relative"}, "checkpoint_dir"),
        ({"checkpoint_dir": "/w", "checkpoint_uri": "b/c"}, "cloud_integration"),
        ({"checkpoint_uri": "b/c", "cloud_integration": "s3"}, "checkpoint_uri"),
        ({"inputs": {"/d": "x"}, "cloud_integration": "s3", "log_interval": 0}, "log_interval"),
        ({"checkpoint_dir": "/w", "on_restore_failure": "maybe"}, "on_restore_failure"),
    ],
)
def test_a_bad_durable_data_argument_fails_the_parse_naming_it(given, field):
    with pytest.raises(GpuMarketValidationError) as raised:
        GpuMarketRunJobOperator(task_id="t", command="true", **COMMON, **given)
    assert raised.value.field == field


def test_templated_durable_data_arguments_wait_for_rendering():
    op = GpuMarketRunJobOperator(
        task_id="t",
        command="true",
        checkpoint_dir="/w/{{ ds }}",
        inputs={"/d": "data/{{ ds }}"},
        cloud_integration="{{ var.value.integration }}",
        **COMMON,
    )
    assert {"checkpoint_dir", "checkpoint_uri", "cloud_integration", "inputs", "outputs"} <= set(op.template_fields)


def test_durable_data_needs_the_job_wrapper():
    with pytest.raises(GpuMarketValidationError, match="give command, not onstart") as raised:
        GpuMarketCreateInstanceOperator(task_id="c", onstart="echo hi", checkpoint_dir="/w", **COMMON)
    assert raised.value.field == "checkpoint_dir"


def test_a_created_instance_restores_only_when_the_task_waits_for_it_and_has_no_outputs():
    GpuMarketCreateInstanceOperator(task_id="c", command="true", checkpoint_dir="/w", **COMMON)
    with pytest.raises(GpuMarketValidationError, match="wait_for_running=True"):
        GpuMarketCreateInstanceOperator(
            task_id="c", command="true", checkpoint_dir="/w", wait_for_running=False, **COMMON
        )
    with pytest.raises(GpuMarketValidationError, match="exit 0") as raised:
        GpuMarketCreateInstanceOperator(task_id="c", command="true", outputs={"/o": "x"}, cloud_integration=1, **COMMON)
    assert raised.value.field == "outputs"
