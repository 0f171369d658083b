"""The one wait flow (waiting.py) that the operator, the trigger and the sensor run on each read: the read judged,
the lease renewed, the bid held, the job's log read when due and once more at its end."""

from __future__ import annotations

import logging

from fake_flows import FlowsOverMethods

from airflow_gpumarket import job_logs, lifecycle
from airflow_gpumarket.exceptions import GpuMarketServerError
from airflow_gpumarket.waiting import Observation, Wait, hold_bid_flow

LOG = logging.getLogger("tests.waiting")
EXIT_0 = "gpumarket: job started\ntraining\ngpumarket: job exited with status 0\n"


class Service(FlowsOverMethods):
    """Instance 7's label, log and bid, as a fake hook's flows see them."""

    def __init__(self, log_text: str = "", *, bid_refused: bool = False) -> None:
        self.log_text = log_text
        self.log_reads = 0
        self.labels: list[str] = []
        self.bids: list[float] = []
        self.bid_refused = bid_refused

    def label_instance(self, instance_id, label):
        self.labels.append(label)
        return {"success": True}

    def get_instance_logs(self, instance_id, **options):
        self.log_reads += 1
        return self.log_text

    def change_bid_flow(self, instance_id, price):
        if self.bid_refused:
            raise GpuMarketServerError("change_bid: HTTP 503 after retries", status_code=503)
        self.bids.append(price)
        return {"success": True}
        yield


def step(wait: Wait, hook: Service, now: float, **seen) -> dict | None:
    return hook.run_flow(wait.step(hook, Observation(at=now, **seen), now))


def test_a_wait_for_a_status_ends_when_the_status_is_read_and_marks_billing_halfway_between_two_reads():
    hook = Service()
    wait = Wait(lifecycle.Watch(boot_deadline=1000.0), job_logs.LogPump(7, 0), LOG)
    assert step(wait, hook, 100.0, status="loading") is None
    event = step(wait, hook, 110.0, status="running")
    assert event["status"] == lifecycle.EventKind.REACHED.value and event["actual_status"] == "running"
    assert wait.running_at == 105.0 and hook.log_reads == 0  # started between the reads; no job: no log read


def test_a_jobs_end_is_judged_by_the_last_read_of_its_log():
    hook = Service(EXIT_0)
    wait = Wait(lifecycle.Watch(wait_for=lifecycle.WAIT_JOB), job_logs.LogPump(7, 3600), LOG)
    assert step(wait, hook, 100.0, status="running") is None
    assert hook.log_reads == 0  # the first periodic read is due an interval after the job started
    event = step(wait, hook, 110.0, status="stopped")  # stopped: a failure, unless its log says exit 0
    assert event["status"] == lifecycle.EventKind.JOB_SUCCEEDED.value and event["exit_status"] == 0
    assert hook.log_reads == 1


def test_a_job_stopped_without_an_exit_status_in_its_log_failed():
    hook = Service("gpumarket: job started\nepoch 1\n")
    wait = Wait(lifecycle.Watch(wait_for=lifecycle.WAIT_JOB), job_logs.LogPump(7, 3600), LOG)
    step(wait, hook, 100.0, status="running")
    assert step(wait, hook, 110.0, status="stopped")["status"] == lifecycle.EventKind.JOB_FAILED.value


def test_a_failed_read_keeps_the_wait_going_on_the_last_status_read(caplog):
    hook = Service()
    wait = Wait(lifecycle.Watch(boot_deadline=1000.0), job_logs.LogPump(7, 0), LOG)
    step(wait, hook, 100.0, status="loading")
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert step(wait, hook, 110.0, error=GpuMarketServerError("HTTP 503", status_code=503)) is None
    assert "Reading instance 7 failed after retries" in caplog.text
    assert wait.read_at == 100.0  # nothing was learnt by the failed read


def test_a_read_renews_the_lease_in_the_label_when_it_is_due():
    hook = Service()
    key = "0123456789ab"
    watch = lifecycle.Watch(label=lifecycle.make_label(key, 200), keepalive=90, lease_cap=10_000, boot_deadline=1e9)
    wait = Wait(watch, job_logs.LogPump(7, 0), LOG)
    step(wait, hook, 120.0, status="loading")  # 80 of 90 s left: not due
    assert hook.labels == []
    step(wait, hook, 150.0, status="loading")
    assert hook.labels == [lifecycle.make_label(key, 240)] and watch.label == hook.labels[0]


def test_hold_bid_raises_the_bid_when_the_machines_minimum_rose_and_only_reports_a_refusal(caplog):
    hook = Service()
    raised = hook.run_flow(hold_bid_flow(hook, 7, 0.21, 0.205, 0.5, LOG))
    assert raised == hook.bids[0] > 0.21
    assert hook.run_flow(hold_bid_flow(hook, 7, 0.21, 0.2, 0.5, LOG)) is None  # margin left: no call
    assert len(hook.bids) == 1
    refused = Service(bid_refused=True)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert refused.run_flow(hold_bid_flow(refused, 7, 0.21, 0.205, 0.5, LOG)) is None
    assert "Could not raise the bid of instance 7" in caplog.text


def test_a_wait_that_holds_the_bid_raises_it_from_what_the_read_shows():
    hook = Service()
    wait = Wait(lifecycle.Watch(boot_deadline=1e9), job_logs.LogPump(7, 0), LOG, hold_bid_up_to=0.5)
    step(wait, hook, 100.0, status="loading", bid=0.21, min_bid=0.205)
    assert hook.bids and wait.bid == hook.bids[0]
    nothing_held = Wait(lifecycle.Watch(boot_deadline=1e9), job_logs.LogPump(7, 0), LOG)
    step(nothing_held, hook, 100.0, status="loading", bid=0.21, min_bid=0.3)
    assert len(hook.bids) == 1
