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
