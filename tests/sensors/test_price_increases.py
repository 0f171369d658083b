"""GpuMarketPendingPriceIncreaseSensor (sensors/price_increases.py), with the service mocked on the wire."""

from __future__ import annotations

import pytest
from hook_fakes import BASE_URL as BASE

from airflow_gpumarket._compat import AirflowException, AirflowFailException, PokeReturnValue
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.sensors.price_increases import GpuMarketPendingPriceIncreaseSensor

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


def test_price_sensor_deferred_event_is_reported_like_a_poke():
    sensor = GpuMarketPendingPriceIncreaseSensor(task_id="t", alert=True)
    with pytest.raises(AirflowFailException, match="list truncated"):
        sensor.execute_complete({}, {"status": "found", "pending": [INCREASE], "truncated": True})
    with pytest.raises(AirflowException, match="refused"):
        sensor.execute_complete({}, {"status": "error", "message": "refused"})
