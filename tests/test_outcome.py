"""How a wait ended, typed: each kind's sentence, the preemption rule, and the trigger's payload both ways."""

from __future__ import annotations

import math

import pytest

from airflow_gpumarket.lifecycle import Rental
from airflow_gpumarket.outcome import MAX_COST, EventKind, Marks, WaitOutcome, from_event, to_event

STOPPED_NO_EXIT_LINE = {"status": "job_failed", "actual_status": "stopped", "exit_status": None, "log_read": True}


def test_every_kind_has_a_sentence_naming_the_instance():
    for kind in EventKind:
        assert "instance 42" in WaitOutcome(kind, actual_status="x").describe(42)
        assert "instance 42" in WaitOutcome(kind, instance_id=42).describe()


@pytest.mark.parametrize("event", [None, {}, {"status": "finished"}, {"status": None}, "reached"])
def test_an_event_of_unknown_kind_is_refused_by_name(event):
    with pytest.raises(ValueError, match="not an event of this provider's trigger"):
        from_event(event)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("instance_id", "7"),
        ("instance_id", True),
        ("exit_status", "0"),
        ("log_tail", "one line"),
        ("log_tail", [1, 2]),
        ("final_lines", [None]),
        ("running_at", math.nan),
        ("running_at", -1.0),
        ("bid", "cheap"),
        ("limit", "max_patience"),
        ("waited", "yes"),
    ],
)
def test_an_event_with_a_value_of_the_wrong_shape_is_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"^{key}: "):
        from_event({"status": "job_failed", "instance_id": 7, key: value})


def test_an_outcome_travels_through_the_trigger_payload_unchanged_with_its_rental():
    rental = Rental(7, 2, 0.5, "RTX 4090", "afgm-x", 1000.0, bid=0.2)
    ended = WaitOutcome(
        EventKind.TIMEOUT,
        instance_id=7,
        actual_status="running",
        limit=MAX_COST,
        log_tail=("a", "b"),
        exit_status=None,
        log_read=True,
        final_lines=("[instance 7] b",),
        marks=Marks(running_at=1010.0, stopped_at=None, read_at=1020.0, bid=0.25, label="afgm-y", ssh_host="h"),
    )
    assert from_event(to_event(ended, rental.to_resume())) == (ended, rental)
    bare = WaitOutcome(EventKind.GONE, instance_id=7)
    assert to_event(bare) == {"status": "gone", "instance_id": 7}
    assert from_event(to_event(bare)) == (bare, None)


def test_an_event_written_by_the_earlier_provider_is_read():
    """The 0.x trigger wrote these keys; a task resumed after an upgrade reads them."""
    rental = Rental(7, 2, 0.5, "g", "afgm-x", 1000.0)
    older = {
        "status": "job_failed",
        "actual_status": "stopped",
        "log_tail": ["boom"],
        "exit_status": 3,
        "log_read": True,
        "instance_id": 7,
        "running_at": 1010.0,
        "label": "afgm-z",
        "resume": rental.to_resume(),
    }
    ended, resumed = from_event(older)
    assert (ended.kind, ended.exit_status, ended.log_tail, ended.marks.label) == (
        EventKind.JOB_FAILED,
        3,
        ("boom",),
        "afgm-z",
    )
    assert resumed == rental and "exit status 3" in ended.describe()


def test_a_job_failed_without_a_log_judged_is_not_called_unreadable():
    unjudged = from_event({"status": "job_failed", "actual_status": "stopped", "instance_id": 7})[0]
    assert unjudged.log_read is None and "failed: the instance is in status 'stopped'" in unjudged.describe()
    judged = from_event({**STOPPED_NO_EXIT_LINE, "instance_id": 7})[0]
    assert "no exit status could be read" in judged.describe()


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
    assert from_event(event)[0].preempted is is_preemption


@pytest.mark.parametrize(
    ("event", "lost"),
    [
        ({"status": "job_failed", "actual_status": "exited"}, True),
        ({"status": "job_failed", "actual_status": "exited", "exit_status": 1, "log_read": True}, False),
        ({"status": "job_failed", "actual_status": "stopped"}, False),
        ({"status": "never_runs", "actual_status": "exited"}, False),
    ],
)
def test_rule_a_host_lost_under_its_job_is_a_failed_status_with_no_exit_status(event, lost):
    assert from_event(event)[0].host_lost is lost


def test_a_time_limit_read_after_the_job_ended_well_is_a_success():
    late = WaitOutcome(EventKind.TIMEOUT, actual_status="stopped", limit=MAX_COST)
    ended = late.with_job_end(["done"], 0, True)
    assert (ended.kind, ended.limit, ended.log_tail) == (EventKind.JOB_SUCCEEDED, None, ("done",))
    assert late.with_job_end([], 4, True).kind is EventKind.TIMEOUT
