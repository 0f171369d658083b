"""Where a renting task counts its rentals (``airflow_gpumarket.metrics``): each start, each end by its outcome, each
failover and each destroy that failed, once, through the renting operator's own paths (fake hook, Stats recorded)."""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_gpumarket import metrics
from airflow_gpumarket._compat import AirflowException

from .renting_fakes import DONE, FakeHook, ctx, job


@pytest.fixture
def counted(monkeypatch) -> Counter:
    names: Counter = Counter()

    class Recorder:
        def incr(self, stat, count=1, rate=None, *, tags=None):
            names[stat.removeprefix("gpumarket.")] += 1

        def timing(self, stat, dt, *, tags=None):
            names[stat.removeprefix("gpumarket.")] += 1

    monkeypatch.setattr(metrics, "_stats", Recorder)
    return names


def rentals(names: Counter) -> dict[str, int]:
    return {name: n for name, n in names.items() if name.startswith("rental.") and name != "rental.boot"}


def test_a_host_that_never_runs_counts_one_failover_and_the_job_one_success(counted):
    hook = FakeHook({1: [None, "exited"], 2: ["running", DONE]})
    job(hook).execute(ctx())
    assert rentals(counted) == {
        "rental.started": 2,
        "rental.ended.never_ran": 1,
        "rental.failover.never_ran": 1,
        "rental.ended.succeeded": 1,
    }
    assert counted["rental.boot"] == 1  # only the second was ever seen running


def test_a_failed_job_ends_its_rental_once_as_job_failed(counted):
    hook = FakeHook({1: ["running", "stopped"]})
    hook.log_text = "gpumarket: job exited with status 3\n"
    with pytest.raises(AirflowException):
        job(hook).execute(ctx())
    assert rentals(counted) == {"rental.started": 1, "rental.ended.job_failed": 1}


def test_a_destroy_that_still_fails_counts_and_the_rental_ends_as_task_failed(counted):
    hook = FakeHook({1: [None, "exited"]}, destroy_fails=True)
    with pytest.raises(AirflowException, match="DESTROY FAILED"):
        job(hook).execute(ctx())
    assert counted["instance.destroy_failed"] >= 1
    assert counted["rental.started"] == 1 and counted["rental.ended.task_failed"] == 1
