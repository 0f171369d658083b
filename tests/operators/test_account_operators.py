"""Serverless, host and account operators, with the service mocked on the wire."""

from __future__ import annotations

import pytest

from airflow_gpumarket._compat import AirflowException, AirflowFailException, PokeReturnValue
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator, GpuMarketDeleteDeploymentOperator
from airflow_gpumarket.operators.volumes import GpuMarketCreateVolumeListingOperator
from airflow_gpumarket.sensors.price_increases import GpuMarketPendingPriceIncreaseSensor
from airflow_gpumarket.triggers.price_increases import GpuMarketPendingPriceIncreaseTrigger

from .conftest import BASE

INCREASE = {
    "pending_price_increase_id": 5,
    "contract_id": 42,
    "host_id": 9,
    "new_gpu_costpersec": 0.0003,
    "new_disk_ram_costpersec": 0.00002,
    "old_gpu_costpersec": 0.0002,
    "old_disk_ram_costpersec": 0.00002,
    "contract_end_date": 1,
    "ask_end_date": 2,
    "created_at": 3,
}


# --- endpoints ----------------------------------------------------------------------------------------------
def test_create_endpoint_sends_the_given_fields_and_returns_the_new_id(requests_mock):
    requests_mock.post(f"{BASE}/api/v0/endptjobs", json={"success": True, "result": 314})
    op = GpuMarketCreateEndpointOperator(
        task_id="t",
        endpoint_name="llm",
        endpoint_state="active",
        max_workers=4,
        max_queue_time=30,
        target_queue_time=10,
    )
    assert op.execute({}) == 314
    assert requests_mock.last_request.json() == {
        "endpoint_name": "llm",
        "endpoint_state": "active",
        "max_workers": 4,
        "max_queue_time": 30,
        "target_queue_time": 10,
    }


def test_rule_target_queue_time_at_most_max_queue_time_is_checked_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^target_queue_time"):
        GpuMarketCreateEndpointOperator(task_id="t", max_queue_time=5, target_queue_time=6)


def test_endpoint_state_enum_is_checked_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^endpoint_state"):
        GpuMarketCreateEndpointOperator(task_id="t", endpoint_state="paused")


def test_templated_endpoint_fields_are_checked_after_rendering(requests_mock):
    op = GpuMarketCreateEndpointOperator(task_id="t", endpoint_state="{{ params.state }}")
    op.endpoint_state = "paused"
    with pytest.raises(GpuMarketValidationError, match="^endpoint_state"):
        op.execute({})
    assert requests_mock.call_count == 0


def test_create_endpoint_is_not_resent_after_a_502(requests_mock):
    requests_mock.post(f"{BASE}/api/v0/endptjobs", status_code=502, json={"error": "bad_gateway"})
    with pytest.raises(Exception, match="502"):
        GpuMarketCreateEndpointOperator(task_id="t", endpoint_name="x").execute({})
    assert requests_mock.call_count == 1


# --- deployments ------------------------------------------------------------------------------------------
def test_delete_deployment_sends_name_and_tag_and_returns_the_count(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 2})
    assert GpuMarketDeleteDeploymentOperator(task_id="t", name="llm", tag="v1").execute({}) == 2
    assert requests_mock.last_request.json() == {"name": "llm", "tag": "v1"}


def test_delete_deployment_count_zero_succeeds_by_default(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 0})
    assert GpuMarketDeleteDeploymentOperator(task_id="t", name="llm").execute({}) == 0
    assert requests_mock.last_request.json() == {"name": "llm"}


def test_delete_deployment_count_zero_fails_with_fail_if_none(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 0})
    with pytest.raises(AirflowException, match="No deployment matched name 'llm'"):
        GpuMarketDeleteDeploymentOperator(task_id="t", name="llm", fail_if_none=True).execute({})


def test_delete_deployment_without_name_is_refused_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^name"):
        GpuMarketDeleteDeploymentOperator(task_id="t", name="")


# --- volume listings ---------------------------------------------------------------------------------------
RESULT = {
    "success": True,
    "you_sent": {"machines": [1, 2]},
    "results": [
        {"machine_id": 1, "user_id": 7, "extended": 0, "new_contracts": [{"id": 11, "size": 100}], "upd_contracts": []},
        {"machine_id": 2, "user_id": 7, "extended": 1, "new_contracts": [], "upd_contracts": [12]},
    ],
}


def test_volume_listing_returns_and_logs_per_machine_results(requests_mock, task_log):
    requests_mock.post(f"{BASE}/api/v0/volumes", json=RESULT)
    op = GpuMarketCreateVolumeListingOperator(task_id="t", machines=[1, 2], hidden_listing=True)
    assert op.execute({}) == RESULT
    assert requests_mock.last_request.json() == {"machines": [1, 2], "hidden_listing": True}
    log = task_log()
    assert "Machine 1: new contracts 11 (100 GB)" in log
    assert "updated contracts [12]" in log


@pytest.mark.parametrize(
    ("status", "body", "advice"),
    [
        (400, {"error": "invalid_args", "msg": "Invalid machine id"}, "machine id is not valid"),
        (
            400,
            {"error": "invalid_args", "msg": "No such machine(s) for your account"},
            "not registered to this account",
        ),
        (402, {"success": False, "msg": "asks can only be created for an online machine"}, "machine is offline"),
        (422, {"error": "invalid_args", "msg": "disk ask update failed"}, "refused the arguments"),
    ],
)
def test_volume_listing_documented_errors_say_what_to_do(requests_mock, status, body, advice):
    requests_mock.post(f"{BASE}/api/v0/volumes", status_code=status, json=body)
    with pytest.raises(AirflowException) as caught:
        GpuMarketCreateVolumeListingOperator(task_id="t", machine=1).execute({})
    assert advice in str(caught.value) and body["msg"] in str(caught.value) and f"HTTP {status}" in str(caught.value)


def test_volume_listing_needs_machine_or_machines_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^machine"):
        GpuMarketCreateVolumeListingOperator(task_id="t")


# --- price increases -----------------------------------------------------------------------------------------
def _pending(requests_mock, items, truncated=False):
    requests_mock.get(
        f"{BASE}/api/v0/instances/pending-price-increases",
        json={"success": True, "count": len(items), "pending_price_increases": items, "truncated": truncated},
    )


def test_price_sensor_succeeds_with_the_increases_and_reports_old_and_new_costs(requests_mock, task_log):
    _pending(requests_mock, [INCREASE])
    sensor = GpuMarketPendingPriceIncreaseSensor(task_id="t", deferrable=False)
    result = sensor.poke({})
    assert isinstance(result, PokeReturnValue) and result.xcom_value == [INCREASE]
    log = task_log()
    assert "contract 42" in log and "GPU 0.0002 -> 0.0003 (+50%)" in log


def test_price_sensor_keeps_waiting_when_nothing_is_pending(requests_mock):
    _pending(requests_mock, [])
    assert GpuMarketPendingPriceIncreaseSensor(task_id="t", deferrable=False).poke({}) is False


def test_price_sensor_only_counts_the_given_contracts(requests_mock):
    _pending(requests_mock, [INCREASE])
    assert GpuMarketPendingPriceIncreaseSensor(task_id="t", contract_ids=[7], deferrable=False).poke({}) is False
    assert GpuMarketPendingPriceIncreaseSensor(task_id="t", contract_ids=[42], deferrable=False).poke({})


def test_price_sensor_alert_mode_fails_the_task(requests_mock):
    _pending(requests_mock, [INCREASE])
    sensor = GpuMarketPendingPriceIncreaseSensor(task_id="t", mode="alert", deferrable=False)
    assert sensor.mode == "poke" and sensor.alert
    with pytest.raises(AirflowFailException, match="1 host-requested price increase"):
        sensor.poke({})


def test_price_sensor_warns_when_the_server_truncated_the_list(requests_mock, task_log):
    _pending(requests_mock, [INCREASE], truncated=True)
    GpuMarketPendingPriceIncreaseSensor(task_id="t", deferrable=False).poke({})
    assert "truncated the pending price increase list" in task_log()


def test_price_sensor_check_once_succeeds_empty_when_nothing_is_pending(requests_mock):
    _pending(requests_mock, [])
    result = GpuMarketPendingPriceIncreaseSensor(task_id="t", check_once=True, mode="alert").poke({})
    assert isinstance(result, PokeReturnValue) and result.is_done and result.xcom_value == []


def test_price_sensor_bad_contract_ids_are_refused_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^contract_ids"):
        GpuMarketPendingPriceIncreaseSensor(task_id="t", contract_ids=[])


def test_price_trigger_serialize_round_trip():
    trigger = GpuMarketPendingPriceIncreaseTrigger(gpumarket_conn_id="c", contract_ids=[1], poll_interval=5)
    path, kwargs = trigger.serialize()
    assert path == "airflow_gpumarket.triggers.price_increases.GpuMarketPendingPriceIncreaseTrigger"
    assert GpuMarketPendingPriceIncreaseTrigger(**kwargs).serialize() == (path, kwargs)


def test_price_sensor_deferred_event_is_reported_like_a_poke():
    sensor = GpuMarketPendingPriceIncreaseSensor(task_id="t", alert=True)
    with pytest.raises(AirflowFailException, match="list truncated"):
        sensor.execute_complete({}, {"status": "found", "pending": [INCREASE], "truncated": True})
    with pytest.raises(AirflowException, match="refused"):
        sensor.execute_complete({}, {"status": "error", "message": "refused"})


def test_endpoint_fields_are_named_once_in_the_api_and_the_operator_takes_each():
    import inspect

    from airflow_gpumarket import api
    from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator

    keywords = set(inspect.signature(GpuMarketCreateEndpointOperator.__init__).parameters)
    assert set(api.ENDPOINT_FIELDS) <= keywords
    assert len(set(api.ENDPOINT_FIELDS)) == len(api.ENDPOINT_FIELDS) == 13
    for name in api.ENDPOINT_FIELDS:  # the docs come from the table too: one :param each
        assert GpuMarketCreateEndpointOperator.__doc__.count(f":param {name}:") == 1, name
