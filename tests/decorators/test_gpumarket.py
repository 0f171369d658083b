"""@task.gpumarket at parse time: registered with Airflow, refuses what cannot be shipped, accepts XCom inputs."""

from __future__ import annotations

from datetime import datetime

import pytest
from fake_flows import FlowsOverMethods

from airflow_gpumarket.decorators.gpumarket import _GpuMarketDecoratedOperator, gpumarket_task
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.lifecycle import task_key
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure

COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img"}


def dag():
    from airflow.providers.common.compat.sdk import DAG

    return DAG(dag_id="parse", start_date=datetime(2026, 1, 1), schedule=None)


def train(data: dict, epochs: int = 1) -> dict:
    return {"rows": len(data), "epochs": epochs}


def test_task_gpumarket_is_registered_with_airflow():
    from airflow.providers.common.compat.sdk import task

    with dag():
        out = task.gpumarket(**COMMON)(train)({"a": 1})
    assert isinstance(out.operator, _GpuMarketDecoratedOperator)
    assert out.operator.custom_operator_name == "@task.gpumarket"


def test_the_function_is_shipped_without_its_decorator_and_command_is_not_templated():
    with dag():
        op = gpumarket_task(**COMMON)(train)({"a": 1}, epochs=3).operator
    assert "def train(data: dict" in op._source and "@" not in op._source.splitlines()[0]
    assert "command" not in op.template_fields and {"op_args", "op_kwargs", "instance"} <= set(op.template_fields)
    assert destroy_rentals_on_failure in op.on_failure_callback


def test_a_literal_argument_too_large_even_packed_is_refused_at_parse_time():
    import secrets

    blob = secrets.token_hex(20_000)  # random: does not compress
    with dag(), pytest.raises(GpuMarketValidationError, match="python_callable.*object storage"):
        gpumarket_task(**COMMON)(train)({"blob": blob})


def test_a_literal_argument_that_is_not_json_is_refused_at_parse_time():
    with dag(), pytest.raises(GpuMarketValidationError, match="argument 'data'.*not a JSON value"):
        gpumarket_task(**COMMON)(train)(data={"when": datetime(2026, 1, 1)})


def test_upstream_outputs_and_jinja_are_accepted_at_parse_time_and_checked_at_run_time():
    from airflow.providers.common.compat.sdk import task

    with dag():
        upstream = task(lambda: {"a": 1}, task_id="up")()
        op = gpumarket_task(**COMMON)(train)(upstream, epochs="{{ params.epochs }}").operator
    assert op.op_args and op.op_kwargs == {"epochs": "{{ params.epochs }}"}


def test_a_context_parameter_is_refused_because_the_instance_has_no_context():
    def uses_ti(ti=None):
        return 1

    with dag(), pytest.raises(GpuMarketValidationError, match="'ti' is an Airflow context key"):
        gpumarket_task(**COMMON)(uses_ti)()


def test_requirements_are_checked_at_parse_time():
    with dag(), pytest.raises(GpuMarketValidationError, match="requirements"):
        gpumarket_task(**COMMON, requirements=["numpy; rm -rf /"])(train)({})


def test_the_provider_info_declares_the_decorator():
    from airflow_gpumarket.get_provider_info import get_provider_info

    (entry,) = get_provider_info()["task-decorators"]
    assert entry == {"class-name": "airflow_gpumarket.decorators.gpumarket.gpumarket_task", "name": "gpumarket"}


# --- the decorator's own destroys, with a mocked hook (issue 21) ------------------------------------------------
class LogHook(FlowsOverMethods):
    """Answers every read of an instance's log with ``text``; records destroys."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.destroyed: list[int] = []

    def get_instance_logs(self, instance_id, **kwargs):
        return self.text

    def destroy_instance(self, instance_id):
        self.destroyed.append(instance_id)
        return {"success": True}


def _ended(text: str, **event):
    """A deferred @task.gpumarket resumed by its trigger's event: its job ended (exit 0 by default)."""
    from types import SimpleNamespace

    from airflow_gpumarket import lifecycle

    with dag():
        op = gpumarket_task(**COMMON)(train)({"a": 1}).operator
    hook = LogHook(text)
    op.__dict__["hook"] = hook
    context = {"run_id": "run-1", "ti": SimpleNamespace(try_number=1, map_index=-1)}
    rental = lifecycle.Rental(instance_id=1001, offer_id=1, dph_total=0.5, gpu_name="x", label=None, created_at=0.0)
    event = {"status": "job_succeeded", "actual_status": "stopped", "exit_status": 0, "instance_id": 1001, **event}
    return op, hook, context, {**event, "resume": rental.to_resume()}


def _result_line(op, context, value) -> str:
    import base64
    import json

    from airflow_gpumarket import python_job

    payload = base64.b64encode(json.dumps(value).encode()).decode()
    return f"{python_job.marker(task_key(op, context))} {payload}"


def test_a_returned_value_is_read_from_the_stopped_instance_which_is_then_destroyed():
    op, hook, context, event = _ended("")
    hook.text = f"{_result_line(op, context, {'rows': 1})}\ngpumarket: job exited with status 0\n"
    assert op.execute_complete(context, event) == {"rows": 1}
    assert hook.destroyed == [1001]


def test_exit_zero_without_a_readable_return_value_destroys_and_fails():
    from airflow_gpumarket._compat import AirflowException

    op, hook, context, event = _ended("gpumarket: job exited with status 0\n")
    with pytest.raises(AirflowException, match="return value could not be read"):
        op.execute_complete(context, event)
    assert hook.destroyed == [1001]


def test_an_unreadable_log_after_the_wait_saw_exit_zero_is_still_not_a_return_value():
    from airflow_gpumarket._compat import AirflowException

    op, hook, context, event = _ended("")  # the wait's final read saw status 0; this read gets nothing
    with pytest.raises(AirflowException, match="return value could not be read"):
        op.execute_complete(context, event)
    assert hook.destroyed == [1001]
