"""The rental's life as pure rules: labels, leases, and what each observed status means."""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle as lc
from airflow_gpumarket.outcome import Marks

KEY = "0123456789ab"


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
    assert rental.observe(Marks(label=None)) is False  # a wait without a label keeps the one the task knows
    assert rental.label == "old"
    assert rental.observe(Marks(running_at=5.0, read_at=6.0, label="renewed", ssh_host="ssh1.example")) is True
    assert rental.observe(Marks(running_at=5.0, read_at=9.0, ssh_host="ssh2.example", bid=0.3)) is False
    rental.give_up("instance 1 never ran")
    assert (rental.label, rental.ssh_host, rental.running_at, rental.read_at) == ("renewed", "ssh1.example", 5.0, 9.0)
    assert rental.bid is None  # a held bid changes a bid rental's price only: this one is on demand
    assert rental.attempts.reasons == ["instance 1 never ran"]
    assert lc.Rental.from_resume(rental.to_resume()) == rental
    assert rental.marks() == Marks(5.0, None, 9.0, None, "renewed", "ssh1.example")
