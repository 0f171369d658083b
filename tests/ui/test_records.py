"""What a renting task writes to its XComs for the GPU rentals page and its "GPU rental" link."""

from __future__ import annotations

import logging

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.ui import records
from airflow_gpumarket.ui.links import GpuRentalLink

LOG = logging.getLogger(__name__)


class Clock:
    """The service's clock: far ahead of this host's (the simulator runs fast), ticking an hour per read."""

    def __init__(self, start: float = 5000.0, step: float = 3600.0) -> None:
        self.now, self.step = start - step, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


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


def test_rule_a_rentals_end_record_carries_the_cost_its_task_reported_and_its_kind():
    ti = PushingTi()
    recorder = records.RentalRecorder({"ti": ti}, LOG, "c", clock=Clock(start=1000.0, step=7200.0))
    held = rental()
    recorder.start(held)
    held.ended_at, held.cost, held.cost_kind = 2000.0, 0.1234567, "charged"  # what the guard learnt at the destroy
    recorder.end(41)
    ended = ti.pushed[records.record_key(41)]
    assert (ended["ended_at"], ended["cost"], ended["cost_kind"]) == (2000.0, 0.1234567, "charged")


def test_a_rental_is_recorded_when_it_starts_with_the_address_its_link_opens_while_the_task_still_runs():
    ti = PushingTi()
    records.RentalRecorder({"ti": ti}, LOG, "gpumarket_default", clock=Clock()).start(rental())
    assert ti.pushed[records.record_key(41)]["try_number"] == 2
    assert ti.pushed[records.URL_XCOM_KEY] == "gpumarket/?instance=41#rental-41"
    if is_airflow_2():  # the webserver asks the link itself
        assert set(ti.pushed) == {records.record_key(41), records.URL_XCOM_KEY}
    else:  # Airflow 3 reads a link from its XCom key, which it writes only when the task's process ends or defers
        assert ti.pushed[GpuRentalLink().xcom_key] == ti.pushed[records.URL_XCOM_KEY]


def test_a_rental_resumed_after_a_deferral_is_not_written_again_and_its_end_records_its_cost():
    ti = PushingTi()
    recorder = records.RentalRecorder({"ti": ti}, LOG, "gpumarket_default", clock=Clock())
    resumed = rental()
    resumed.recorded_at = 5000.0  # what the record said before the deferral, on the service's clock
    recorder.start(resumed, write=False)
    assert ti.pushed == {}
    recorder.end(41)
    assert ti.pushed[records.record_key(41)]["cost"] is not None


def test_a_recorder_whose_xcom_cannot_be_written_warns_and_lets_the_task_go_on(caplog):
    recorder = records.RentalRecorder({"ti": PushingTi(fail=True)}, LOG, "c", clock=Clock())
    recorder.start(rental())
    recorder.end(41)
    assert "Could not record the rental for the GPU rentals page: the XCom backend is down" in caplog.text


def test_rule_a_rental_is_timed_on_the_services_clock_from_its_start_to_its_end():
    ti = PushingTi()
    recorder = records.RentalRecorder({"ti": ti}, LOG, "c", clock=Clock(start=5000.0))
    held = rental()  # created_at 1000.0: this host's clock, which the record does not use
    recorder.start(held)
    assert held.recorded_at == 5000.0 and ti.pushed[records.record_key(41)]["created_at"] == 5000.0
    recorder.end(41)
    ended = ti.pushed[records.record_key(41)]
    assert ended["ended_at"] == 8600.0 and ended["cost"] == 0.5  # an hour at 0.5 $/h on the service's clock


def read(held, status: str, at: float) -> bool:
    """One read of a wait at the service's time ``at``, as the rental observes it (``Rental.observe``)."""
    from airflow_gpumarket.lifecycle import billing_marks
    from airflow_gpumarket.outcome import Marks

    previous = held.read_at if held.read_at is not None else held.recorded_at
    running, stopped = billing_marks(held.running_at, held.stopped_at, status, at, previous)
    return held.observe(Marks(running_at=running, stopped_at=stopped, read_at=at))


def test_rule_a_rental_costs_its_price_from_first_seen_running_until_first_seen_stopped_or_destroyed():
    ti = PushingTi()
    recorder = records.RentalRecorder({"ti": ti}, LOG, "c", clock=Clock(start=1000.0, step=7200.0))
    held = rental()
    recorder.start(held)  # created at 1000.0 on the service's clock, then boots
    assert read(held, "loading", 1100.0) is False and held.running_at is None
    assert read(held, "running", 1300.0) is True  # the first read that found it running: written
    recorder.running(held)
    assert ti.pushed[records.record_key(41)]["running_at"] == 1200.0  # halfway from the read before
    assert read(held, "running", 4700.0) is False
    read(held, "stopped", 4900.0)  # its job ended and stopped it: compute billing ended by then
    read(held, "stopped", 5000.0)
    recorder.end(41)  # destroyed at 8200.0, after its log was read
    ended = ti.pushed[records.record_key(41)]
    assert (ended["running_at"], ended["stopped_at"], ended["ended_at"]) == (1200.0, 4800.0, 8200.0)
    assert ended["cost"] == 0.5  # 3600 s at 0.5 $/h


def test_rule_billing_marks_start_at_the_first_running_read_and_a_resume_clears_the_stop():
    marks, previous = (None, None), None
    for status, at in [(None, 1.0), ("loading", 2.0), ("running", 3.0), ("stopped", 4.0), ("stopped", 5.0)]:
        marks, previous = lifecycle.billing_marks(*marks, status, at, previous), at
    assert marks == (2.5, 3.5)  # each change halfway between the read that found it and the one before
    assert lifecycle.billing_marks(*marks, "running", 6.0) == (2.5, None)  # resumed (an outbid instance won back)
    assert lifecycle.billing_marks(None, None, "running", 7.0) == (7.0, None)  # no read before: the read's time
    assert lifecycle.billing_marks(None, None, "stopped", 1.0) == (None, None)  # never ran: no compute to end


def test_an_end_written_by_another_task_carries_what_costs_and_attributes_the_rental():
    seen = {"label": "afgm-0123456789ab-99", "start_date": 100.0, "is_bid": True, "bid_price": 0.3, "dph_total": 0.9}
    record = records.end_only(instance_id=7, ended_at=3700.0, ended_by="teardown", instance=seen)
    assert record == {
        "instance_id": 7,
        "end_only": True,
        "ended_at": 3700.0,
        "ended_by": "teardown",
        "label": "afgm-0123456789ab-99",
        "created_at": 100.0,
        "running_at": None,
        "stopped_at": None,
        "hourly_price": 0.3,
        "gpu_name": None,
        "offer_id": None,
    }
    ti = PushingTi()
    hook = type("Hook", (), {"service_now": lambda self: 3700.0})()
    records.push_end({"ti": ti}, LOG, hook, 7, ended_by="reap")
    assert ti.pushed[records.end_key(7)]["ended_by"] == "reap"
