"""GpuMarketCreateVolumeListingOperator (operators/volumes.py), with the service mocked on the wire."""

from __future__ import annotations

import pytest

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.volumes import GpuMarketCreateVolumeListingOperator

from .conftest import BASE

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
