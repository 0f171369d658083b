"""The running time a task's history gives the expected-cost choice: the job's own, from its rental records."""

from __future__ import annotations

import pytest

from airflow_gpumarket import task_history
from airflow_gpumarket.exceptions import GpuMarketValidationError

T0 = 1_800_000_000.0


def rental(created: float, running: float | None, stopped: float | None, ended: float | None = None) -> dict:
    return {"instance_id": 1, "created_at": created, "running_at": running, "stopped_at": stopped, "ended_at": ended}


def test_the_running_time_is_from_first_seen_running_until_seen_stopped():
    assert task_history.job_seconds([rental(T0, T0 + 120, T0 + 420, T0 + 450)]) == 300


def test_a_rental_destroyed_while_running_ran_until_its_end():
    assert task_history.job_seconds([rental(T0, T0 + 120, None, T0 + 200)]) == 80


def test_after_a_failover_the_latest_rental_is_the_jobs():
    lost = rental(T0, T0 + 100, None, T0 + 900)
    assert task_history.job_seconds([rental(T0 + 1000, T0 + 1100, T0 + 1160), lost]) == 60


@pytest.mark.parametrize(
    "records",
    [
        [],
        [rental(T0, None, None, T0 + 60)],  # never seen running
        [rental(T0, T0 + 60, None, None)],  # handed over: still alive
        [{**rental(T0, T0 + 60, T0 + 90), "end_only": True}],  # another's end record
    ],
)
def test_no_running_time_without_a_rental_that_ran_to_an_end(records):
    assert task_history.job_seconds(records) is None


def test_the_median_prefers_the_records_and_falls_back_to_the_durations_boot_included():
    a, b, c = ("d", "r1", "t", -1), ("d", "r2", "t", -1), ("d", "r3", "t", -1)
    durations = {a: 500.0, b: 700.0, c: None}
    assert task_history.median_of(durations, {}) == 600
    assert task_history.median_of(durations, {c: [rental(T0, T0, T0 + 40)]}) == 40
    assert task_history.median_of({c: None}, {}) is None


@pytest.mark.parametrize(("dag_id", "task_id", "field"), [("", "t", "dag_id"), ("d", None, "task_id")])
def test_the_task_must_be_named(dag_id, task_id, field):
    with pytest.raises(GpuMarketValidationError, match=field):
        task_history.check_task(dag_id, task_id)
