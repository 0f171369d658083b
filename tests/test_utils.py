"""What the operators and sensors share (utils.py): instance ids, durations, and values only known at run time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import (
    check_instance_id_argument,
    duration_seconds,
    instance_id_from,
    is_templated,
    resolved_at_run_time,
)


class Output:
    """Stands for an upstream task's output (an XComArg): resolved when the task runs."""

    def resolve(self, context):
        return 7

    def iter_references(self):
        return iter(())


@pytest.mark.parametrize(
    ("value", "instance_id"),
    [(7, 7), ("7", 7), ({"instance_id": 7, "ssh_host": "h"}, 7), (None, None), ("None", None), (" ", None)],
)
def test_an_instance_id_may_be_an_id_its_text_or_a_renting_operators_result(value, instance_id):
    assert instance_id_from(value) == instance_id


@pytest.mark.parametrize("value", ["i-12", 0, -3, "2.5", {"instance_id": "x"}])
def test_anything_else_is_refused_naming_instance_id(value):
    with pytest.raises(GpuMarketValidationError, match="^instance_id: "):
        instance_id_from(value)


def test_an_instance_id_known_only_at_run_time_is_checked_then():
    check_instance_id_argument("{{ ti.xcom_pull('create') }}")
    check_instance_id_argument(Output())
    with pytest.raises(GpuMarketValidationError, match="^instance_id"):
        check_instance_id_argument("abc")


def test_a_duration_is_seconds_or_a_timedelta_and_zero_only_when_allowed():
    assert duration_seconds("lease", timedelta(minutes=2)) == 120.0
    assert duration_seconds("lease", 5) == 5.0
    assert duration_seconds("grace", 0, zero_ok=True) == 0.0
    with pytest.raises(GpuMarketValidationError, match="^lease: "):
        duration_seconds("lease", 0)
    with pytest.raises(GpuMarketValidationError, match="^grace: "):
        duration_seconds("grace", timedelta(seconds=-1), zero_ok=True)


@pytest.mark.parametrize(("value", "zero_ok"), [("2h", False), (None, False), (-5, True), (timedelta(0), False)])
def test_rule_a_duration_that_is_not_one_is_refused_saying_a_timedelta_or_seconds_is_expected(value, zero_ok):
    with pytest.raises(GpuMarketValidationError) as caught:
        duration_seconds("max_runtime", value, zero_ok=zero_ok)
    assert caught.value.field == "max_runtime"
    assert "must be a datetime.timedelta or seconds" in caught.value.problem and repr(value) in caught.value.problem


def test_rule_an_operators_duration_given_as_text_fails_the_dag_file_saying_a_timedelta_is_expected():
    from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

    with pytest.raises(GpuMarketValidationError, match="^max_runtime: must be a datetime.timedelta .* got '2h'"):
        GpuMarketRunJobOperator(task_id="t", image="i", command="c", offer_id=1, max_runtime="2h")


def test_jinja_or_an_upstream_output_at_any_depth_is_templated_and_plain_values_are_not():
    assert is_templated("{{ params.image }}") and is_templated("{% if x %}a{% endif %}")
    assert is_templated({"env": {"RUN": "{{ run_id }}"}}) and is_templated([1, Output()])
    assert not is_templated("pytorch/pytorch") and not is_templated({"disk": 40, "env": {"A": "1"}})
    assert not is_templated(timedelta(hours=1)) and not is_templated(None)
    assert resolved_at_run_time({"a": [Output()]}) and not resolved_at_run_time({"a": "{{ x }}"})
