"""The rental's life as pure rules: labels, leases, and what each observed status means."""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket import lifecycle as lc

KEY = "0123456789ab"
STOPPED_NO_EXIT_LINE = {"status": "job_failed", "actual_status": "stopped", "exit_status": None, "log_read": True}


def test_rental_key_is_the_same_for_every_try_and_differs_per_task_instance():
    key = lc.rental_key("dag", "run1", "task", -1)
    assert key == lc.rental_key("dag", "run1", "task", -1)
    assert len({key, lc.rental_key("dag", "run2", "task", -1), lc.rental_key("dag", "run1", "task", 0)}) == 3


def test_label_round_trips_and_is_short():
    label = lc.make_label(lc.rental_key("d", "r", "t", 3), 1_800_000_000.7)
    assert len(label) <= 28
    assert lc.parse_label(label) == (lc.rental_key("d", "r", "t", 3), 1_800_000_000)


@pytest.mark.parametrize("label", [None, "", "my-training-box", "afgm-xyz-1", "afgm-0123456789ab-", 42])
def test_labels_not_written_by_the_provider_are_ignored(label):
    assert lc.parse_label(label) is None


def test_rentals_of_finds_every_try_of_one_task_instance_oldest_first():
    key = lc.rental_key("d", "r", "t", -1)
    instances = [
        {"id": 9, "label": lc.make_label(key, 200)},
        {"id": 3, "label": lc.make_label(key, 100)},
        {"id": 5, "label": lc.make_label(lc.rental_key("d", "r", "other", -1), 100)},
        {"id": 7, "label": "hand-made"},
    ]
    assert [i["id"] for i in lc.rentals_of(instances, key)] == [3, 9]


def _status(status, **kw):
    return lc.evaluate(wait_for=lc.WAIT_STATUS, status=status, gone=False, now=0, seen_running=False, **kw)


@pytest.mark.parametrize("status", [None, "loading"])
def test_provisioning_and_loading_keep_waiting(status):
    assert _status(status) is None


def test_running_is_reached():
    assert _status("running") == {"status": lc.EventKind.REACHED, "actual_status": "running"}


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
def test_rule_exited_unknown_offline_never_become_running(status):
    assert _status(status) == {"status": lc.EventKind.NEVER_RUNS, "actual_status": status}


def test_a_status_the_spec_does_not_name_is_treated_as_not_going_to_run():
    assert _status("stopped")["status"] == lc.EventKind.NEVER_RUNS


def test_other_target_status_is_waited_for():
    assert _status("running", target_status="stopped") is None
    assert _status("stopped", target_status="stopped")["status"] == lc.EventKind.REACHED


def test_gone_while_waiting_for_a_status_is_reported():
    event = lc.evaluate(wait_for=lc.WAIT_STATUS, status=None, gone=True, now=0, seen_running=False)
    assert event == {"status": lc.EventKind.GONE}


def test_boot_deadline_applies_only_while_booting():
    assert _status("loading", boot_deadline=0)["status"] == lc.EventKind.BOOT_TIMEOUT
    assert _status("loading", boot_deadline=1) is None
    assert _status("running", boot_deadline=0)["status"] == lc.EventKind.REACHED


def _job(status, *, gone=False, seen_running=False, **kw):
    return lc.evaluate(wait_for=lc.WAIT_JOB, status=status, gone=gone, now=0, seen_running=seen_running, **kw)


def test_job_gone_means_the_command_exited_zero():
    assert _job(None, gone=True) == {"status": lc.EventKind.JOB_SUCCEEDED}


def test_job_stopped_means_the_command_failed():
    assert _job("stopped", seen_running=True) == {"status": lc.EventKind.JOB_FAILED, "actual_status": "stopped"}


def test_job_running_and_booting_keep_waiting():
    assert _job("running", seen_running=True) is None
    assert _job("loading") is None


def test_job_host_failure_before_running_fails_over_and_after_running_fails_the_job():
    assert _job("exited")["status"] == lc.EventKind.NEVER_RUNS
    assert _job("offline", seen_running=True)["status"] == lc.EventKind.JOB_FAILED


def test_job_deadline_stops_waiting():
    assert _job("running", seen_running=True, deadline=0)["status"] == lc.EventKind.TIMEOUT


def test_max_runtime_counts_from_when_the_job_started_not_from_creation():
    """A slow boot does not eat into the job's time: max_runtime runs from the first time running was seen."""
    assert _job("loading", max_runtime=10, running_since=None) is None  # still booting: no job time used yet
    assert _job("running", seen_running=True, max_runtime=10, running_since=-9) is None
    event = _job("running", seen_running=True, max_runtime=10, running_since=-10)
    assert event == {"status": lc.EventKind.TIMEOUT, "actual_status": "running", "limit": lc.MAX_RUNTIME}
    assert "ran longer than max_runtime" in lc.describe_event(event, 42)


def test_job_gone_after_its_lease_expired_is_not_a_success():
    """The reaper may destroy an instance whose lease expired: gone then proves nothing about the job."""
    assert _job(None, gone=True, lease_until=-1) == {"status": lc.EventKind.LEASE_EXPIRED}
    assert _job(None, gone=True, lease_until=0) == {"status": lc.EventKind.JOB_SUCCEEDED}  # gone within the lease
    assert _job("running", seen_running=True, lease_until=-1) is None  # still there: keep watching


def test_lease_is_renewed_once_a_third_of_keepalive_has_passed_and_never_past_the_cap():
    label = lc.make_label(KEY, 1000 + 900)  # written at 1000 with a 15-minute keepalive
    assert lc.renewed_label(label, now=1000 + 299, keepalive=900, lease_cap=10_000) is None
    assert lc.renewed_label(label, now=1000 + 301, keepalive=900, lease_cap=10_000) == lc.make_label(KEY, 2201)
    assert lc.renewed_label(label, now=1000 + 301, keepalive=900, lease_cap=2000) == lc.make_label(KEY, 2000)
    assert lc.renewed_label(label, now=1000 + 301, keepalive=900, lease_cap=1900) is None  # at the cap already


@pytest.mark.parametrize("label", [None, "my-box", "afgm-xyz-1"])
def test_lease_of_a_label_the_provider_did_not_write_is_never_renewed(label):
    assert lc.renewed_label(label, now=0, keepalive=900, lease_cap=10_000) is None
    assert lc.lease_of(label) is None


@pytest.mark.parametrize(
    ("start_date", "expected"),
    [(1500.0, 1500.0), (1500, 1500.0), (None, 1900.0), ("1500", 1900.0), (2500.0, 1900.0), (0, 1900.0), (True, 1900.0)],
)
def test_an_instance_started_at_its_start_date_when_plausible(start_date, expected):
    assert lc.started_at({"start_date": start_date}, fallback=1900.0, now=2000.0) == expected


def test_every_event_has_a_sentence_naming_the_instance():
    for kind in lc.EventKind:
        assert "instance 42" in lc.describe_event({"status": kind.value, "actual_status": "x"}, 42)


@pytest.mark.parametrize("event", [None, {}, {"status": "finished"}, {"status": None}, "reached"])
def test_an_event_of_unknown_kind_is_refused_by_name(event):
    with pytest.raises(ValueError, match="not an event of this provider's trigger"):
        lc.event_kind(event)
    assert "unexpected event" in lc.describe_event(event if isinstance(event, dict) else {}, 42)


def test_event_kinds_travel_as_plain_strings():
    """Trigger events are serialised by Airflow: the kinds put in them are str values, read back as the Enum."""
    event = lc.Watch().observe(0, status="running")
    assert type(event["status"]) is str and lc.event_kind(event) is lc.EventKind.REACHED


def test_watch_counts_the_job_from_the_first_running_read_and_judges_a_failed_read_by_the_last_status():
    watch = lc.Watch(wait_for=lc.WAIT_JOB, boot_deadline=100, max_runtime=50)
    assert watch.observe(10, status="loading") is None and watch.running_since is None
    assert watch.observe(20, status="running") is None and watch.running_since == 20 and watch.changed
    assert watch.observe(30, unread=True) is None and watch.status == "running" and not watch.changed
    assert watch.observe(69, status="running") is None
    assert watch.observe(70, status="running") == {
        "status": "timeout",
        "actual_status": "running",
        "limit": lc.MAX_RUNTIME,
    }


def test_watch_reads_the_lease_from_the_label_it_last_wrote():
    watch = lc.Watch(wait_for=lc.WAIT_JOB, label=lc.make_label(KEY, 100), keepalive=90, lease_cap=1000)
    assert watch.lease_renewal(20) is None  # 80 of 90 s left
    renewed = watch.lease_renewal(50)
    assert renewed == lc.make_label(KEY, 140)
    assert watch.observe(120, gone=True) == {"status": "lease_expired"}  # the renewal was never written
    watch.label = renewed
    assert watch.observe(120, gone=True) == {"status": "job_succeeded"}


def test_watch_without_keepalive_never_renews():
    assert lc.Watch(label=lc.make_label(KEY, 100), lease_cap=1000).lease_renewal(99) is None


def test_rental_round_trips_through_the_event_and_refuses_anything_else():
    attempts = lc.Attempts(tried=[5, 2], reasons=["r"], preemptions=1, lost_machines=[9], round_start=1)
    rental = lc.Rental(1, 2, 0.5, "RTX 4090", "afgm-x", 1000.0, lease_cap=2000.0, bid=0.21, attempts=attempts)
    assert lc.Rental.from_resume(rental.to_resume()) == rental
    flat = {k: v for k, v in rental.to_resume().items() if k != "attempts"}
    with pytest.raises(ValueError, match="unknown rental fields"):
        lc.Rental.from_resume({**flat, "tried": [2], "reasons": ["r"]})  # attempts belong in "attempts"
    with pytest.raises(ValueError, match="bad attempts"):
        lc.Rental.from_resume({**flat, "attempts": {"colour": "red"}})
    with pytest.raises(ValueError, match="no rental to resume"):
        lc.Rental.from_resume({"rental": rental.to_resume()})
    with pytest.raises(ValueError, match="unknown rental fields"):
        lc.Rental.from_resume({**rental.to_resume(), "colour": "red"})


def test_estimated_cost_is_price_times_hours():
    assert lc.estimated_cost(0.5, 7200) == 1.0
    assert lc.estimated_cost(None, 10) is None


def test_a_rental_changes_only_through_what_it_learns_while_held():
    rental = lc.Rental(
        instance_id=1, offer_id=2, dph_total=0.5, gpu_name="g", label="old", created_at=0.0, ssh_host=None
    )
    rental.relabel(None)  # an event without a label keeps the one the task knows
    assert rental.label == "old"
    rental.relabel("renewed")
    rental.learn_ssh_host("ssh1.example")
    rental.learn_ssh_host("ssh2.example")  # the first address stays
    rental.continue_attempts(lc.Attempts(tried=[7, 2], reasons=["offer 7 was taken"]))
    rental.give_up("instance 1 never ran")
    assert (rental.label, rental.ssh_host, rental.attempts.tried) == ("renewed", "ssh1.example", [7, 2])
    assert rental.attempts.reasons == ["offer 7 was taken", "instance 1 never ran"]
    assert lc.Rental.from_resume(rental.to_resume()) == rental


def test_every_wait_ends_alike_a_final_read_only_for_a_job_that_ended_with_reads_on():
    from airflow_gpumarket import job_logs

    reading, silent = job_logs.LogPump(7, 30.0), job_logs.LogPump(7, 0.0)
    failed = {"status": lc.EventKind.JOB_FAILED.value, "actual_status": "stopped"}
    reached = {"status": lc.EventKind.REACHED.value, "actual_status": "running"}
    assert lc.needs_final_read(failed, reading) and not lc.needs_final_read(failed, silent)
    assert not lc.needs_final_read(reached, reading)
    reading.off = True  # the server has no logs endpoint: no read, yet the end is judged from what was read
    assert not lc.needs_final_read(failed, reading)
    ended = lc.end_of_wait(dict(failed), reading)
    assert ended["instance_id"] == 7 and "exit_status" in ended
    assert lc.end_of_wait(dict(reached), reading) == {**reached, "instance_id": 7}


# --- Preemptions and the wait for the bid ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("event", "is_preemption"),
    [
        (STOPPED_NO_EXIT_LINE, True),
        ({**STOPPED_NO_EXIT_LINE, "exit_status": 3}, False),  # the job's own stop: it printed its status first
        ({**STOPPED_NO_EXIT_LINE, "log_read": False}, False),  # a log not read proves nothing: a failure
        ({**STOPPED_NO_EXIT_LINE, "actual_status": "exited"}, False),  # the host failed
        ({"status": "job_failed", "actual_status": "stopped"}, False),  # no final read at all
        ({"status": "preempted", "actual_status": "stopped", "waited": True}, True),
        ({"status": "job_succeeded", "exit_status": 0, "log_read": True}, False),
    ],
)
def test_rule_a_preemption_is_a_stop_the_job_did_not_announce_in_a_log_read_to_its_end(event, is_preemption):
    assert lifecycle.preempted(event) is is_preemption


def test_rule_an_outbid_instance_left_to_wait_is_waited_through_until_max_outbid_wait():
    watch = lifecycle.Watch(wait_for=lifecycle.WAIT_JOB, boot_deadline=10.0)
    assert watch.observe(1.0, status="running") is None
    watch.outbid_wait_until = 100.0
    assert watch.observe(50.0, status="stopped") is None  # still outbid
    assert watch.observe(60.0, status="scheduling") is None
    assert watch.observe(100.0, status="stopped") == {"status": "preempted", "actual_status": "stopped", "waited": True}
    assert watch.observe(101.0, status="loading") is None  # the bid won: booting again is not a boot timeout
    assert watch.outbid_wait_until is None  # back: its next stop is judged anew, even if no read sees it running
    assert watch.observe(102.0, status="running") is None
    assert watch.observe(103.0, status="stopped") == {"status": "job_failed", "actual_status": "stopped"}
    assert watch.observe(104.0, status="offline")["status"] == "job_failed"  # a failed host is never waited for


def test_rule_a_wait_for_the_bid_that_ran_out_ends_as_the_log_says_when_the_resumed_run_ended_unseen():
    ran_out = {"status": "preempted", "actual_status": "stopped", "waited": True}
    assert lifecycle.with_job_end(dict(ran_out), {"exit_status": 0, "log_read": True})["status"] == "job_succeeded"
    assert lifecycle.with_job_end(dict(ran_out), {"exit_status": 2, "log_read": True})["status"] == "job_failed"
    still = lifecycle.with_job_end(dict(ran_out), {"exit_status": None, "log_read": True})
    assert still["status"] == "preempted" and lifecycle.preempted(still)


def test_max_cost_ends_the_wait_on_the_services_clock():
    watch = lifecycle.Watch(wait_for=lifecycle.WAIT_JOB, cost_deadline=2000.0)
    assert watch.observe(10.0, status="running", service_at=1999.0) is None
    event = watch.observe(11.0, status="running", service_at=2000.0)
    assert event == {"status": "timeout", "actual_status": "running", "limit": lifecycle.MAX_COST}
    described = lifecycle.describe_event(event, 7)
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
    watch = lc.Watch(wait_for=lc.WAIT_JOB)
    watch.status = "running"
    event = lc.never_started(watch, pump, running_at=1000.0, at=1000.0 + ran_for)
    assert (event is not None) is fails_over
    if fails_over:
        assert event["status"] == lc.EventKind.NEVER_RUNS.value and event["log_tail"][-1].startswith("simulator")
        assert "never started" in lc.describe_event(event, 7) and "onstart is not executed" in lc.describe_event(
            event, 7
        )


def test_a_wrapper_line_shown_by_an_earlier_wait_counts_as_the_wrapper_running():
    from airflow_gpumarket.job_logs import LogPump

    pump = LogPump(7, 30.0, shown=["gpumarket: waiting up to 1800 s for the staged data"])
    pump.read(0.0, "unrelated\n")
    watch = lc.Watch(wait_for=lc.WAIT_JOB)
    watch.status = "running"
    assert lc.never_started(watch, pump, running_at=0.0, at=3600.0) is None
