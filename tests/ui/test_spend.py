"""The GPU rentals page's rules (ui/spend.py), from plain inputs (no server, no database): which instance is whose,
which are orphans, and what was spent."""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui import records
from airflow_gpumarket.ui.spend import RecordRow, TaskState, live_rentals, orphan_reason, records_of, spans, spend

from .rows import KEY, LABEL, NOW, row


@pytest.mark.parametrize(
    ("label", "recorded", "task", "reason"),
    [
        ("my own box", None, None, None),  # made by hand: never an orphan here
        (lifecycle.make_label(KEY, NOW - 1), row(), TaskState("running"), "its lease expired at"),
        (LABEL, None, None, "no task recorded renting it, and its label names no task instance found"),
        (LABEL, row(), None, "the task that rented it is gone"),
        (LABEL, row(), TaskState("running"), None),
        (LABEL, row(), TaskState("deferred"), None),
        (LABEL, row(), TaskState("up_for_retry"), None),
        (LABEL, row(), TaskState("success"), "the task that rented it is success"),
        (LABEL, row(), TaskState(None), "the task that rented it is cleared"),
        (LABEL, row(handed_over=True), TaskState("success", run_state="running"), None),
        (
            LABEL,
            row(handed_over=True),
            TaskState("success", run_state="failed"),
            "it was handed to its DAG run, which is failed",
        ),
    ],
)
def test_rule_an_orphan_is_a_labelled_instance_whose_lease_expired_or_whose_task_no_longer_holds_it(
    label, recorded, task, reason
):
    found = orphan_reason(label, recorded, task, NOW)
    assert found == reason if reason is None else found.startswith(reason)


def test_a_live_rental_is_matched_to_its_task_through_its_record_and_priced_at_the_bid():
    instance = {
        "id": 1,
        "actual_status": "running",
        "label": LABEL,
        "dph_total": 0.9,
        "is_bid": True,
        "bid_price": 0.4,
        "start_date": NOW - 1800,
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
    }
    (rental,) = live_rentals([("c", instance)], {1: row()}, {row().ti_key: TaskState("running")}, NOW)
    assert (rental.dag_id, rental.task_state, rental.orphan_reason) == ("train_dag", "running", None)
    assert rental.hourly_price == 0.4 and rental.uptime_seconds == 1800 and rental.cost_so_far == pytest.approx(0.2)


def test_a_stopped_rental_bills_its_disk_alone_from_when_its_task_saw_it_stop():
    base = row()
    record = {**base.record, "disk_hourly": 0.02, "running_at": NOW - 3600, "stopped_at": NOW - 1800}
    recorded = RecordRow(base.dag_id, base.run_id, base.task_id, base.map_index, record)
    listed = {"id": 1, "actual_status": "stopped", "label": LABEL, "dph_total": 0.5, "start_date": NOW - 3600}
    (rental,) = live_rentals([("c", listed)], {1: recorded}, {base.ti_key: TaskState("running")}, NOW)
    assert rental.billing_now == 0.02 and rental.hourly_price == 0.5
    assert rental.cost_so_far == pytest.approx(0.5 / 2 + 0.02)  # compute for its half hour running, disk for the hour
    (running,) = live_rentals([("c", {**listed, "actual_status": "running"})], {}, {}, NOW)
    assert running.billing_now == 0.5  # no record: the price, disk unknown
    (unknown,) = live_rentals([("c", listed)], {}, {}, NOW)
    assert unknown.billing_now is None  # stopped, no record: what its disk bills is not known


def test_rule_every_duration_is_measured_on_the_services_clock():
    # The service's clock runs an hour ahead (the simulator's runs ahead by design): its instance started half an
    # hour ago by its own clock, which by this host's clock is half an hour in the future.
    listed = {"id": 1, "actual_status": "running", "label": LABEL, "dph_total": 0.5, "start_date": NOW + 1800}
    (rental,) = live_rentals([("c", listed)], {}, {}, NOW, {"c": 3600.0})
    assert rental.uptime_seconds == 1800 and rental.cost_so_far == pytest.approx(0.25)
    # With no start_date, the task's record (also on the service's clock) counts until the service's now.
    unstarted = {**listed, "start_date": None}
    (recorded,) = live_rentals([("c", unstarted)], {1: row()}, {row().ti_key: TaskState("running")}, NOW, {"c": 3600})
    assert recorded.uptime_seconds == 7200 and recorded.cost_so_far == pytest.approx(1.0)
    # The spend of an open rental the service lists is its live row's figure, so the two sections agree.
    assert spend(spans([row()]), {1: rental.cost_so_far}, NOW - 86400, NOW).total == pytest.approx(0.25)


def test_rule_spend_counts_rentals_created_in_the_window_from_start_to_first_recorded_end_or_live_cost():
    rows = [
        row(1, cost=0.25),  # ended by its renter: 0.5 $/h for 60 s
        row(2, run_id="run-2"),  # open and alive: its live row's cost
        row(3, run_id="run-3", created_at=NOW - 7200),  # open, gone, no end anywhere: unknown, not guessed
        row(4, created_at=NOW - 10 * 86400, cost=9.0),  # before the window
        row(5, dag_id="other", cost=1.0),
        row(6, run_id="run-6", created_at=NOW - 7200),  # open in its record; its end written by a teardown task
        RecordRow("train_dag", "run-6", "teardown", -1, end(6, NOW - 3600, label=label_of("run-6"))),
        # seen running 3000 s ago, stopped by its job 1800 s later, destroyed after its log was read
        RecordRow(
            "train_dag",
            "run-7",
            "train",
            -1,
            {**row(7).record, "running_at": NOW - 3000, "stopped_at": NOW - 1200, "ended_at": NOW - 600},
        ),
    ]
    result = spend(spans(rows), {2: 0.5}, window_start=NOW - 86400, now=NOW)
    minute = 0.5 / 60
    assert result.per_dag == {
        "train_dag": pytest.approx(minute + 0.5 + 0.5 + 0.25, abs=1e-6),
        "other": pytest.approx(minute, abs=1e-6),
    }
    assert result.per_run[("train_dag", "run-6")] == pytest.approx(0.5) and result.rentals == 5
    assert result.per_run[("train_dag", "run-7")] == pytest.approx(0.25)
    assert result.unknown_cost == 1
    assert sum(sum(day.values()) for day in result.per_day.values()) == pytest.approx(result.total)


def label_of(run_id):
    return lifecycle.make_label(lifecycle.rental_key("train_dag", run_id, "train", -1), NOW + 600)


def end(instance_id, ended_at, label=None, created_at=None):
    seen = {"label": label, "start_date": created_at, "dph_total": 0.5}
    return records.end_only(instance_id=instance_id, ended_at=ended_at, ended_by="teardown", instance=seen)


def test_rule_a_rental_with_no_record_is_attributed_to_the_task_instance_its_label_names():
    owner = ("team_b_train", "run-1", "train", -1)
    label = lifecycle.make_label(lifecycle.rental_key(*owner), NOW + 600)
    listed = {"id": 9, "actual_status": "running", "label": label, "dph_total": 0.5, "start_date": NOW - 3600}
    (rental,) = live_rentals([("c", listed)], {}, {owner: TaskState("failed")}, NOW, None, {KEY_OF(label): owner})
    assert rental.owner == owner and rental.by_label and rental.dag_id == "team_b_train"
    assert (
        rental.orphan_reason
        == "no task recorded renting it; its label names team_b_train / run-1 / train, which is failed"
    )
    (running,) = live_rentals([("c", listed)], {}, {owner: TaskState("running")}, NOW, None, {KEY_OF(label): owner})
    assert running.orphan_reason is None  # its task still runs: not an orphan, records or not
    # Destroyed (by the reaper, on the reaper's own task instance): still counted to the DAG its label names.
    reaped = RecordRow("reaper", "daily", "reap", -1, end(9, NOW, label=label, created_at=NOW - 3600))
    assert spend(spans([reaped], {KEY_OF(label): owner}), {}, NOW - 86400, NOW).per_dag == {
        "team_b_train": pytest.approx(0.5)
    }
    assert spend(spans([reaped], {}), {}, NOW - 86400, NOW).per_dag == {}  # no owner: in no DAG's spend


def KEY_OF(label):  # noqa: N802 - reads as the label's key
    return lifecycle.parse_label(label)[0]


def test_rule_an_instance_takes_the_latest_record_whose_task_its_label_names():
    mine, older = row(1, created_at=NOW - 60), row(1, created_at=NOW - 90000, run_id="run-0")  # same id, reused
    by_hand = row(2, run_id="run-2")
    listed = [("c", {"id": 1, "label": LABEL}), ("c", {"id": 2, "label": "my own box"}), ("c", {"id": 3})]
    assert records_of(listed, [mine, older, by_hand]) == {1: mine, 2: by_hand}
    assert records_of([("c", {"id": 1, "label": label_of("run-9")})], [mine, older]) == {}  # neither is its rental
