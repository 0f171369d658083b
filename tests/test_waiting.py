"""The one wait flow (waiting.py) that the operator, the trigger and the sensor run on each read: the read judged,
the lease renewed, the bid held, the job's log read when due and once more at its end."""

from __future__ import annotations

import logging

import pytest
from fake_flows import FlowsOverMethods

from airflow_gpumarket import job_logs, lifecycle, outcome, waiting
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


def as_event(ended: outcome.WaitOutcome | None) -> dict | None:
    """An outcome as its trigger's payload (``outcome.to_event``) without an unnamed instance: what rules compare."""
    if ended is None:
        return None
    event = outcome.to_event(ended)
    if event["instance_id"] is None:
        del event["instance_id"]
    return event


def step(wait: Wait, hook: Service, now: float, **seen) -> dict | None:
    return as_event(hook.run_flow(wait.step(hook, Observation(at=now, **seen), now)))


def test_a_wait_for_a_status_ends_when_the_status_is_read_and_marks_billing_halfway_between_two_reads():
    hook = Service()
    wait = Wait(waiting.Watch(boot_deadline=1000.0), job_logs.LogPump(7, 0), LOG)
    assert step(wait, hook, 100.0, status="loading") is None
    event = step(wait, hook, 110.0, status="running")
    assert event["status"] == outcome.EventKind.REACHED.value and event["actual_status"] == "running"
    assert wait.running_at == 105.0 and hook.log_reads == 0  # started between the reads; no job: no log read


def test_a_jobs_end_is_judged_by_the_last_read_of_its_log():
    hook = Service(EXIT_0)
    wait = Wait(waiting.Watch(wait_for=lifecycle.WAIT_JOB), job_logs.LogPump(7, 3600), LOG)
    assert step(wait, hook, 100.0, status="running") is None
    assert hook.log_reads == 0  # the first periodic read is due an interval after the job started
    event = step(wait, hook, 110.0, status="stopped")  # stopped: a failure, unless its log says exit 0
    assert event["status"] == outcome.EventKind.JOB_SUCCEEDED.value and event["exit_status"] == 0
    assert hook.log_reads == 1


def test_a_job_stopped_without_an_exit_status_in_its_log_failed():
    hook = Service("gpumarket: job started\nepoch 1\n")
    wait = Wait(waiting.Watch(wait_for=lifecycle.WAIT_JOB), job_logs.LogPump(7, 3600), LOG)
    step(wait, hook, 100.0, status="running")
    assert step(wait, hook, 110.0, status="stopped")["status"] == outcome.EventKind.JOB_FAILED.value


def test_a_failed_read_keeps_the_wait_going_on_the_last_status_read(caplog):
    hook = Service()
    wait = Wait(waiting.Watch(boot_deadline=1000.0), job_logs.LogPump(7, 0), LOG)
    step(wait, hook, 100.0, status="loading")
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert step(wait, hook, 110.0, error=GpuMarketServerError("HTTP 503", status_code=503)) is None
    assert "Reading instance 7 failed after retries" in caplog.text
    assert wait.read_at == 100.0  # nothing was learnt by the failed read


def test_a_read_renews_the_lease_in_the_label_when_it_is_due():
    hook = Service()
    key = "0123456789ab"
    watch = waiting.Watch(label=lifecycle.make_label(key, 200), keepalive=90, lease_cap=10_000, boot_deadline=1e9)
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
    wait = Wait(waiting.Watch(boot_deadline=1e9, hold_bid_up_to=0.5), job_logs.LogPump(7, 0), LOG)
    step(wait, hook, 100.0, status="loading", bid=0.21, min_bid=0.205)
    assert hook.bids and wait.bid == hook.bids[0]
    nothing_held = Wait(waiting.Watch(boot_deadline=1e9), job_logs.LogPump(7, 0), LOG)
    step(nothing_held, hook, 100.0, status="loading", bid=0.21, min_bid=0.3)
    assert len(hook.bids) == 1


# --- Watch: what each read means, as a pure state machine ---------------------------------------------------
KEY = "0123456789ab"


def _status(status, **kw):
    return as_event(
        waiting.evaluate(wait_for=lifecycle.WAIT_STATUS, status=status, gone=False, now=0, seen_running=False, **kw)
    )


@pytest.mark.parametrize("status", [None, "loading"])
def test_provisioning_and_loading_keep_waiting(status):
    assert _status(status) is None


def test_running_is_reached():
    assert _status("running") == {"status": outcome.EventKind.REACHED, "actual_status": "running"}


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
def test_rule_exited_unknown_offline_never_become_running(status):
    assert _status(status) == {"status": outcome.EventKind.NEVER_RUNS, "actual_status": status}


def test_a_status_the_spec_does_not_name_is_treated_as_not_going_to_run():
    assert _status("stopped")["status"] == outcome.EventKind.NEVER_RUNS


def test_other_target_status_is_waited_for():
    assert _status("running", target_status="stopped") is None
    assert _status("stopped", target_status="stopped")["status"] == outcome.EventKind.REACHED


def test_gone_while_waiting_for_a_status_is_reported():
    event = waiting.evaluate(wait_for=lifecycle.WAIT_STATUS, status=None, gone=True, now=0, seen_running=False)
    assert as_event(event) == {"status": outcome.EventKind.GONE}


def test_boot_deadline_applies_only_while_booting():
    assert _status("loading", boot_deadline=0)["status"] == outcome.EventKind.BOOT_TIMEOUT
    assert _status("loading", boot_deadline=1) is None
    assert _status("running", boot_deadline=0)["status"] == outcome.EventKind.REACHED


def _job(status, *, gone=False, seen_running=False, **kw):
    return as_event(
        waiting.evaluate(wait_for=lifecycle.WAIT_JOB, status=status, gone=gone, now=0, seen_running=seen_running, **kw)
    )


def test_job_gone_means_the_command_exited_zero():
    assert _job(None, gone=True) == {"status": outcome.EventKind.JOB_SUCCEEDED}


def test_job_stopped_means_the_command_failed():
    assert _job("stopped", seen_running=True) == {"status": outcome.EventKind.JOB_FAILED, "actual_status": "stopped"}


def test_job_running_and_booting_keep_waiting():
    assert _job("running", seen_running=True) is None
    assert _job("loading") is None


def test_job_host_failure_before_running_fails_over_and_after_running_fails_the_job():
    assert _job("exited")["status"] == outcome.EventKind.NEVER_RUNS
    assert _job("offline", seen_running=True)["status"] == outcome.EventKind.JOB_FAILED


def test_job_deadline_stops_waiting():
    assert _job("running", seen_running=True, deadline=0)["status"] == outcome.EventKind.TIMEOUT


def test_max_runtime_counts_from_when_the_job_started_not_from_creation():
    """A slow boot does not eat into the job's time: max_runtime runs from the first time running was seen."""
    assert _job("loading", max_runtime=10, running_since=None) is None  # still booting: no job time used yet
    assert _job("running", seen_running=True, max_runtime=10, running_since=-9) is None
    event = _job("running", seen_running=True, max_runtime=10, running_since=-10)
    assert event == {"status": outcome.EventKind.TIMEOUT, "actual_status": "running", "limit": outcome.MAX_RUNTIME}
    assert "ran longer than max_runtime" in outcome.from_event(event)[0].describe(42)


def test_job_gone_after_its_lease_expired_is_not_a_success():
    """The reaper may destroy an instance whose lease expired: gone then proves nothing about the job."""
    assert _job(None, gone=True, lease_until=-1) == {"status": outcome.EventKind.LEASE_EXPIRED}
    assert _job(None, gone=True, lease_until=0) == {"status": outcome.EventKind.JOB_SUCCEEDED}  # gone within the lease
    assert _job("running", seen_running=True, lease_until=-1) is None  # still there: keep watching


def test_event_kinds_travel_as_plain_strings():
    """Trigger events are serialised by Airflow: the kinds put in them are str values, read back as the Enum."""
    event = outcome.to_event(waiting.Watch().observe(0, status="running"))
    assert type(event["status"]) is str and outcome.from_event(event)[0].kind is outcome.EventKind.REACHED


def test_watch_counts_the_job_from_the_first_running_read_and_judges_a_failed_read_by_the_last_status():
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB, boot_deadline=100, max_runtime=50)
    assert watch.observe(10, status="loading") is None and watch.running_since is None
    assert watch.observe(20, status="running") is None and watch.running_since == 20 and watch.changed
    assert watch.observe(30, unread=True) is None and watch.status == "running" and not watch.changed
    assert watch.observe(69, status="running") is None
    assert as_event(watch.observe(70, status="running")) == {
        "status": "timeout",
        "actual_status": "running",
        "limit": outcome.MAX_RUNTIME,
    }


def test_watch_reads_the_lease_from_the_label_it_last_wrote():
    watch = waiting.Watch(
        wait_for=lifecycle.WAIT_JOB, label=lifecycle.make_label(KEY, 100), keepalive=90, lease_cap=1000
    )
    assert watch.lease_renewal(20) is None  # 80 of 90 s left
    renewed = watch.lease_renewal(50)
    assert renewed == lifecycle.make_label(KEY, 140)
    assert as_event(watch.observe(120, gone=True)) == {"status": "lease_expired"}  # the renewal was never written
    watch.label = renewed
    assert as_event(watch.observe(120, gone=True)) == {"status": "job_succeeded"}


def test_watch_without_keepalive_never_renews():
    assert waiting.Watch(label=lifecycle.make_label(KEY, 100), lease_cap=1000).lease_renewal(99) is None


def test_every_wait_ends_alike_a_final_read_only_for_a_job_that_ended_with_reads_on():
    reading, silent = job_logs.LogPump(7, 30.0), job_logs.LogPump(7, 0.0)
    failed = outcome.WaitOutcome(outcome.EventKind.JOB_FAILED, actual_status="stopped")
    reached = outcome.WaitOutcome(outcome.EventKind.REACHED, actual_status="running")
    assert waiting.needs_final_read(failed, reading) and not waiting.needs_final_read(failed, silent)
    assert not waiting.needs_final_read(reached, reading)
    reading.off = True  # the server has no logs endpoint: no read, yet the end is judged from what was read
    assert not waiting.needs_final_read(failed, reading)


def test_a_jobs_end_without_reads_is_not_judged_by_a_log_and_a_status_wait_never_is():
    hook = Service("gpumarket: exit status 0\n")
    silent = Wait(waiting.Watch(wait_for=lifecycle.WAIT_JOB), job_logs.LogPump(7, 0), LOG)
    step(silent, hook, 100.0, status="running")
    ended = hook.run_flow(silent.step(hook, Observation(at=110.0, status="stopped"), 110.0))
    assert ended.kind is outcome.EventKind.JOB_FAILED and ended.log_read is None and hook.log_reads == 0
    assert ended.instance_id == 7
    status = Wait(waiting.Watch(), job_logs.LogPump(7, 30.0), LOG)
    reached = hook.run_flow(status.step(hook, Observation(at=120.0, status="running"), 120.0))
    assert reached.kind is outcome.EventKind.REACHED and reached.log_read is None and reached.instance_id == 7


def test_rule_an_outbid_instance_left_to_wait_is_waited_through_until_max_outbid_wait():
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB, boot_deadline=10.0)
    assert watch.observe(1.0, status="running") is None
    watch.outbid_wait_until = 100.0
    assert watch.observe(50.0, status="stopped") is None  # still outbid
    assert watch.observe(60.0, status="scheduling") is None
    assert as_event(watch.observe(100.0, status="stopped")) == {
        "status": "preempted",
        "actual_status": "stopped",
        "waited": True,
    }
    assert watch.observe(101.0, status="loading") is None  # the bid won: booting again is not a boot timeout
    assert watch.outbid_wait_until is None  # back: its next stop is judged anew, even if no read sees it running
    assert watch.observe(102.0, status="running") is None
    assert as_event(watch.observe(103.0, status="stopped")) == {"status": "job_failed", "actual_status": "stopped"}
    assert (
        as_event(watch.observe(104.0, status="offline"))["status"] == "job_failed"
    )  # a failed host is never waited for


def test_rule_a_wait_for_the_bid_that_ran_out_ends_as_the_log_says_when_the_resumed_run_ended_unseen():
    ran_out = outcome.WaitOutcome(outcome.EventKind.PREEMPTED, actual_status="stopped", waited=True)
    assert ran_out.with_job_end([], 0, True).kind is outcome.EventKind.JOB_SUCCEEDED
    assert ran_out.with_job_end([], 2, True).kind is outcome.EventKind.JOB_FAILED
    assert not ran_out.with_job_end([], 2, True).waited
    still = ran_out.with_job_end([], None, True)
    assert still.kind is outcome.EventKind.PREEMPTED and still.preempted and still.waited


def test_max_cost_counts_compute_from_the_first_read_that_saw_it_running_and_disk_from_creation():
    # $1 max_cost, $3.6/h of compute and $0.36/h of disk from service time 0: loading bills the disk only.
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB, max_cost=1.0, cost_rates=[0.0, 3.6, 0.36])
    assert watch.observe(10.0, status="loading", service_at=3000.0) is None  # $0.30 of disk, no compute
    assert watch.shown == "'loading'"
    assert watch.observe(11.0, status="running", service_at=3000.0) is None
    assert watch.observe(12.0, status="running", service_at=3500.0) is None  # $0.35 + $0.50
    ended = watch.observe(13.0, status="running", service_at=3600.0)  # $0.36 + $0.60 = $0.96: not yet
    assert ended is None
    ended = watch.observe(14.0, status="running", service_at=3640.0)  # $0.364 + $0.64 = $1.004
    assert as_event(ended) == {"status": "timeout", "actual_status": "running", "limit": outcome.MAX_COST}


def test_a_status_not_reported_yet_is_shown_as_such():
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB)
    watch.observe(1.0, status=None, service_at=1.0)
    assert watch.shown == "no status yet"


def test_max_cost_of_an_older_provider_ends_the_wait_on_the_services_clock():
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB, cost_deadline=2000.0)
    assert watch.observe(10.0, status="running", service_at=1999.0) is None
    ended = watch.observe(11.0, status="running", service_at=2000.0)
    assert as_event(ended) == {"status": "timeout", "actual_status": "running", "limit": outcome.MAX_COST}
    described = ended.describe(7)
    assert "reached max_cost" in described and "destroyed" in described


@pytest.mark.parametrize(
    ("log", "ran_for", "fails_over"),
    [
        ("container started\nsimulator: onstart is not executed\n", 300.0, True),
        ("container started\n", 299.0, False),  # the wrapper may still be on its way
        ("container started\ngpumarket: job started\n", 3600.0, False),  # the wrapper ran
        ("", 3600.0, False),  # an empty log proves nothing
        ("x\n" * 1000, 3600.0, False),  # a log longer than a read: its first lines were not seen
    ],
)
def test_rule_a_running_instance_whose_whole_log_holds_no_wrapper_line_never_starts_its_job(log, ran_for, fails_over):
    from airflow_gpumarket.job_logs import LogPump

    pump = LogPump(7, 30.0)
    pump.read(0.0, log)
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB)
    watch.status = "running"
    event = waiting.never_started(watch, pump, running_at=1000.0, at=1000.0 + ran_for)
    assert (event is not None) is fails_over
    if fails_over:
        assert event.kind is outcome.EventKind.NEVER_RUNS and event.log_tail[-1].startswith("simulator")
        assert "never started" in event.describe(7) and "onstart is not executed" in event.describe(7)


def test_a_wrapper_line_shown_by_an_earlier_wait_counts_as_the_wrapper_running():
    from airflow_gpumarket.job_logs import LogPump

    pump = LogPump(7, 30.0, shown=["gpumarket: waiting up to 1800 s for the staged data"])
    pump.read(0.0, "unrelated\n")
    watch = waiting.Watch(wait_for=lifecycle.WAIT_JOB)
    watch.status = "running"
    assert waiting.never_started(watch, pump, running_at=0.0, at=3600.0) is None
