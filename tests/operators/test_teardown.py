"""GpuMarketStopInstanceOperator and GpuMarketDestroyInstanceOperator (operators/teardown.py), with the service
mocked on the wire."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator, GpuMarketStopInstanceOperator
from airflow_gpumarket.ui import records

from .conftest import BASE

INSTANCE_7 = f"{BASE}/api/v0/instances/7/"
CASES = [
    # (operator, arguments, the argument the message must name)
    (GpuMarketDestroyInstanceOperator, {"instance_id": "abc"}, "instance_id"),
    (GpuMarketDestroyInstanceOperator, {"instance_id": -3}, "instance_id"),
    (GpuMarketStopInstanceOperator, {"instance_id": "i-12"}, "instance_id"),
]


def test_stop_puts_the_stopped_state_to_the_instance(requests_mock):
    requests_mock.put(INSTANCE_7, json={"success": True})
    assert GpuMarketStopInstanceOperator(task_id="t", instance_id=7).execute({}) == {"success": True}
    assert requests_mock.last_request.method == "PUT" and requests_mock.last_request.json() == {"state": "stopped"}


def test_stop_without_an_instance_id_is_refused_when_the_task_runs(requests_mock):
    with pytest.raises(GpuMarketValidationError, match="^instance_id: is empty"):
        GpuMarketStopInstanceOperator(task_id="t", instance_id="").execute({})
    assert requests_mock.call_count == 0


def test_destroy_takes_the_dict_a_create_task_returned_and_records_the_rentals_end(requests_mock):
    requests_mock.get(INSTANCE_7, json={"instances": {"id": 7, "label": "afgm-x", "dph_total": 0.5}})
    requests_mock.delete(INSTANCE_7, json={"success": True})
    pushed = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value}))
    op = GpuMarketDestroyInstanceOperator(task_id="teardown", instance_id={"instance_id": 7, "ssh_host": "h"})
    assert op.execute({"ti": ti}) == {"success": True, "destroyed": 7, "already_gone": False}
    assert requests_mock.last_request.method == "DELETE"
    end = pushed[records.end_key(7)]
    assert end["instance_id"] == 7 and end["ended_by"] == "teardown" and end["label"] == "afgm-x"


def test_destroying_an_instance_already_gone_succeeds_and_records_nothing(requests_mock):
    gone = {"status_code": 404, "json": {"error": "no_such_instance", "msg": "no such instance"}}
    requests_mock.get(INSTANCE_7, **gone)
    requests_mock.delete(INSTANCE_7, **gone)
    pushed = []
    ti = SimpleNamespace(xcom_push=lambda **kwargs: pushed.append(kwargs))
    result = GpuMarketDestroyInstanceOperator(task_id="t", instance_id=7).execute({"ti": ti})
    assert result == {"success": True, "destroyed": 7, "already_gone": True}
    assert pushed == []


@pytest.mark.parametrize(
    "instance_id", [None, "None", "", {"instance_id": None}], ids=["None", "text", "empty", "dict"]
)
def test_destroy_without_an_instance_id_has_nothing_to_do(requests_mock, instance_id):
    """The setup task failed before returning (and destroyed what it made): the teardown succeeds, sending nothing."""
    op = GpuMarketDestroyInstanceOperator(task_id="t", instance_id=instance_id)
    assert op.execute({}) == {"success": True, "destroyed": None}
    assert requests_mock.call_count == 0


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------


test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def test_rule_a_teardown_settles_the_reservation_of_an_instance_already_gone(requests_mock, monkeypatch):
    """A job's wrapper may destroy its own instance: the teardown still settles its reservation, never left open."""
    from airflow_gpumarket.operators import budget

    settled = []
    monkeypatch.setattr(budget, "settle_ended", lambda hook, conn, instance_id, log, **kw: settled.append(instance_id))
    gone = {"status_code": 404, "json": {"error": "no_such_instance", "msg": "no such instance"}}
    requests_mock.get(INSTANCE_7, **gone)
    requests_mock.delete(INSTANCE_7, **gone)
    GpuMarketDestroyInstanceOperator(task_id="t", instance_id=7).execute({})
    assert settled == [7]
