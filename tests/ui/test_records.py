"""What a renting task writes to its XComs for the GPU rentals page and its "GPU rental" link."""

from __future__ import annotations

import logging

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.ui import records
from airflow_gpumarket.ui.links import GpuRentalLink


class PushingTi:
    try_number = 2

    def __init__(self, fail: bool = False) -> None:
        self.pushed: dict[str, object] = {}
        self.fail = fail

    def xcom_push(self, *, key: str, value: object) -> None:
        if self.fail:
            raise RuntimeError("the XCom backend is down")
        self.pushed[key] = value


def rental(instance_id: int = 41) -> lifecycle.Rental:
    return lifecycle.Rental(
        instance_id=instance_id, offer_id=7, dph_total=0.5, gpu_name="RTX 4090", label=None, created_at=1000.0
    )


def test_a_rental_is_recorded_when_it_starts_with_the_address_its_link_opens_while_the_task_still_runs():
    ti = PushingTi()
    records.RentalRecorder({"ti": ti}, logging.getLogger(__name__), "gpumarket_default").start(rental())
    assert ti.pushed[records.record_key(41)]["try_number"] == 2
    assert ti.pushed[records.URL_XCOM_KEY] == "gpumarket/?instance=41#rental-41"
    if is_airflow_2():  # the webserver asks the link itself
        assert set(ti.pushed) == {records.record_key(41), records.URL_XCOM_KEY}
    else:  # Airflow 3 reads a link from its XCom key, which it writes only when the task's process ends or defers
        assert ti.pushed[GpuRentalLink().xcom_key] == ti.pushed[records.URL_XCOM_KEY]


def test_a_rental_resumed_after_a_deferral_is_not_written_again_and_its_end_records_its_cost():
    ti = PushingTi()
    recorder = records.RentalRecorder({"ti": ti}, logging.getLogger(__name__), "gpumarket_default")
    recorder.start(rental(), write=False)
    assert ti.pushed == {}
    recorder.end(41)
    assert ti.pushed[records.record_key(41)]["cost"] is not None


def test_a_recorder_whose_xcom_cannot_be_written_warns_and_lets_the_task_go_on(caplog):
    recorder = records.RentalRecorder({"ti": PushingTi(fail=True)}, logging.getLogger(__name__), "c")
    recorder.start(rental())
    recorder.end(41)
    assert "Could not record the rental for the GPU rentals page: the XCom backend is down" in caplog.text
