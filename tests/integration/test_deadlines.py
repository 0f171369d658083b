"""Deadline-aware interruptible rentals against the simulator: bid while the deadline has room, then on demand.

The task's clock (its renting modules' ``time``) is real time plus what the test moves it on (``TaskClock``). A
``JumpThenOutbid`` player moves it and the simulator's clock on together while the job runs, then outbids the job
through the admin surface: hours of the job pass in a moment on both sides, and no test sleeps.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from .conftest import alive
from .test_interruptible import MarketPlayer, assert_bid_rentals_one_at_a_time, run_to_the_end
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

HOUR = 3600.0
#: Finishes on its second run; on the first it works (sleeps) until the outbid kills it.
SECOND_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT"; [ "$GPUMARKET_ATTEMPT" -ge 2 ] || sleep 60; '
    'echo "finished on attempt $GPUMARKET_ATTEMPT"'
)
#: An hour's job without a checkpoint: bidding needs the job twice and two boots before the deadline.
HOUR_JOB = {"command": SECOND_RUN_FINISHES, "interruptible": True, "expected_runtime": timedelta(hours=1)}


class TaskClock:
    """The renting modules' clock: real time plus ``offset``; its sleeps are real (the simulator runs meanwhile)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def task_clock(monkeypatch) -> TaskClock:
    from airflow_gpumarket.operators import preemption, renting, session

    clock = TaskClock()
    for module in (renting, session, preemption):
        monkeypatch.setattr(module, "time", clock)
    return clock


class JumpThenOutbid(MarketPlayer):
    """Once a bid instance of the job runs its command: both clocks move on ``jump`` seconds, then it is outbid."""

    def __init__(self, sim, clock: TaskClock, jump: float) -> None:
        self.sim, self.clock, self.jump = sim, clock, jump
        self.outbid: list[int] = []
        super().__init__()

    def _run(self) -> None:
        while not self.outbid and not self._stop.wait(0.02):
            for instance in self.sim.alive_instances():
                result = self.sim.onstart_result(instance["id"]) or {}
                if instance.get("is_bid") and result.get("running") and "run attempt=" in result.get("output", ""):
                    self.sim.advance(self.jump)
                    self.clock.offset += self.jump
                    self.sim.outbid(instance["id"])
                    self.outbid.append(instance["id"])
                    break


def started_now(clock: TaskClock) -> dict:
    """A task context whose try started now on the task's clock (a deadline's timedelta counts from its start)."""
    ti = SimpleNamespace(try_number=1, map_index=-1, start_date=datetime.fromtimestamp(clock.time(), UTC))
    return {**context(), "ti": ti}


def test_rule_a_job_whose_deadline_absorbs_a_preemption_keeps_bidding_and_meets_it(sim, task_clock, task_log):
    ctx = started_now(task_clock)
    deadline = ctx["ti"].start_date.timestamp() + 12 * HOUR
    with JumpThenOutbid(sim, task_clock, jump=HOUR) as market:
        result = job(deadline=timedelta(hours=12), **HOUR_JOB).execute(ctx)
    assert result["job_status"] == "succeeded" and market.outbid
    first, second = assert_bid_rentals_one_at_a_time(sim, 2)  # both bids
    assert "finished on attempt 2" in sim.onstart_result(second["id"])["output"]
    assert task_clock.time() < deadline
    assert task_log().count("bidding, and renting on demand from") == 2  # before each rental


def test_rule_a_preemption_that_leaves_no_room_switches_the_job_to_on_demand_and_the_log_says_why(
    sim, task_clock, task_log
):
    """Bidding needs the hour's job twice and two boots; two hours of a 4-hour deadline pass before the outbid."""
    with JumpThenOutbid(sim, task_clock, jump=2 * HOUR):
        result = job(deadline=timedelta(hours=4), **HOUR_JOB).execute(started_now(task_clock))
    assert result["job_status"] == "succeeded" and "bid" not in result
    first, second = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
    assert first["is_bid"] and first["outbids"] == 1 and not second["is_bid"]
    assert first["destroyed_at"] <= second["created_at"]
    log = task_log()
    assert "Deadline: deadline" in log and "in 2 h 0 min: one more preemption (~" in log
    assert "would not fit; renting on demand from now on" in log
    assert alive(sim) == []


def test_rule_a_deadline_without_room_from_the_start_rents_on_demand_at_once(sim, task_log):
    op = job(deadline=timedelta(hours=1, minutes=30), **{**HOUR_JOB, "command": "echo finished"})
    result = op.execute(context())
    assert result["job_status"] == "succeeded" and "bid" not in result
    (instance,) = sim.state()["instances"]
    assert not instance["is_bid"]
    log = task_log()
    assert "in 1 h 30 min: one more preemption" in log and "renting on demand from now on" in log
    assert alive(sim) == []


def test_rule_a_deferred_job_resumed_after_a_preemption_still_switches_to_on_demand(sim, task_clock, task_log):
    op = job(deadline=timedelta(hours=4), deferrable=True, log_interval=0.2, **HOUR_JOB)
    with JumpThenOutbid(sim, task_clock, jump=2 * HOUR):
        result = run_to_the_end(op, started_now(task_clock))
    assert result["job_status"] == "succeeded" and "bid" not in result
    first, second = sorted(sim.state()["instances"], key=lambda i: i["created_at"])
    assert first["is_bid"] and first["outbids"] == 1 and not second["is_bid"]
    assert "would not fit; renting on demand from now on" in task_log()
    assert alive(sim) == []
