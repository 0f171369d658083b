"""Deadline-aware bidding (airflow_gpumarket/deadlines.py): when the next rental may still bid, and the sentence why."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from airflow_gpumarket import deadlines, offer_cost
from airflow_gpumarket.deadlines import CHECKPOINT_INTERVAL, RESTORE_SECONDS, Estimate

MIN = 60.0
HOUR = 3600.0
#: 2026-01-01 06:00 UTC
SIX = datetime(2026, 1, 1, 6, 0, tzinfo=UTC).timestamp()


def estimate(work: float = 50 * MIN, boot: float = 5 * MIN, checkpointed: bool = False) -> Estimate:
    return Estimate(work=work, boot=boot, notice=10.0, checkpointed=checkpointed)


def test_rule_a_timedelta_deadline_counts_from_the_tries_start_and_a_datetime_is_taken_as_it_is():
    assert deadlines.deadline_at(timedelta(hours=2), 1000.0) == 1000.0 + 7200
    assert deadlines.deadline_at(datetime(2026, 1, 1, 6, 0, tzinfo=UTC), 1000.0) == SIX


def test_rule_expected_work_is_expected_runtime_else_the_learned_median_else_max_runtime():
    assert deadlines.expected_work(600.0, 900.0, 3600.0) == 600.0
    assert deadlines.expected_work(None, 900.0, 3600.0) == 900.0
    assert deadlines.expected_work(None, None, 3600.0) == 3600.0
    assert deadlines.expected_work(None, None, None) == 0.0


def test_rule_without_a_checkpoint_a_preemption_loses_all_the_work_left_and_nothing_is_restored():
    e = estimate(work=50 * MIN, boot=5 * MIN)
    assert e.lost == 50 * MIN and e.restore == 0
    assert e.on_demand == 55 * MIN
    assert e.preemption == 10 + 50 * MIN + 5 * MIN


def test_rule_with_a_checkpoint_a_preemption_loses_one_checkpoint_interval_and_adds_a_restore():
    e = estimate(work=50 * MIN, boot=5 * MIN, checkpointed=True)
    assert e.lost == CHECKPOINT_INTERVAL and e.restore == RESTORE_SECONDS
    assert e.on_demand == 5 * MIN + RESTORE_SECONDS + 50 * MIN
    assert e.preemption == 10 + CHECKPOINT_INTERVAL + 5 * MIN + RESTORE_SECONDS
    assert estimate(work=3 * MIN, checkpointed=True).lost == 3 * MIN  # never more than the work left


def test_rule_a_preempted_run_with_a_checkpoint_counts_less_a_restore_and_one_interval():
    assert deadlines.credited_work(40 * MIN) == 40 * MIN - RESTORE_SECONDS - CHECKPOINT_INTERVAL
    assert deadlines.credited_work(5 * MIN) == 0.0


def test_rule_work_already_done_counts_only_when_a_checkpoint_carries_it():
    common = {"done": 40 * MIN, "boot_seen": 300.0, "image_size_gb": None, "notice": 10.0}
    assert deadlines.estimate(HOUR, checkpointed=True, **common).work == 20 * MIN
    assert deadlines.estimate(HOUR, checkpointed=False, **common).work == HOUR
    assert deadlines.estimate(30 * MIN, checkpointed=True, **common).work == 0.0


def test_rule_the_boot_is_the_one_measured_else_the_images_boot_on_a_slow_host():
    assert deadlines.expected_boot(240.0, 6.0) == 240.0
    slow = offer_cost.boot_seconds({}, offer_cost.CostModel(expected_runtime=0.0, image_size_gb=2.0))
    assert deadlines.expected_boot(None, 2.0) == slow
    assert deadlines.expected_boot(None, None) > slow  # the default image (6 GB) boots longer


def test_rule_the_job_bids_while_one_more_preemption_and_finishing_on_demand_fit():
    e = estimate()  # on demand 55 min, a preemption 55 min 10 s
    needs = e.on_demand + e.preemption
    decision = deadlines.decide(SIX, SIX - needs, e)
    assert decision.bids and decision.bid_until == SIX - needs
    assert decision.why.startswith("deadline 06:00 UTC in 1 h 50 min: one more preemption (~55 min)")
    assert "bidding, and renting on demand from 04:09 UTC on" in decision.why


def test_rule_the_job_rents_on_demand_once_one_more_preemption_would_not_fit_and_says_why():
    e = Estimate(work=50 * MIN, boot=8 * MIN, notice=10.0, checkpointed=True)
    decision = deadlines.decide(SIX, SIX - 72 * MIN, e)
    assert not decision.bids
    assert decision.why == (
        "deadline 06:00 UTC in 1 h 12 min: one more preemption (~20 min) plus finishing on demand (a boot and the "
        "50 min left of the job, ~1 h 0 min) would not fit; renting on demand from now on"
    )


def test_rule_when_even_on_demand_may_not_fit_it_still_rents_on_demand_the_fastest_way_left():
    decision = deadlines.decide(SIX, SIX - 30 * MIN, estimate())
    assert not decision.bids
    assert "in 30 min: even finishing on demand" in decision.why and "the fastest way left" in decision.why


def test_rule_a_deadline_already_passed_rents_on_demand_at_once_and_says_so():
    decision = deadlines.decide(SIX, SIX + 12 * MIN, estimate())
    assert not decision.bids
    assert decision.why == "deadline 06:00 UTC passed 12 min ago: renting on demand from now on"


def test_rule_a_deadline_more_than_a_day_away_is_shown_with_its_date():
    decision = deadlines.decide(SIX, SIX - 2 * 86400, estimate())
    assert decision.why.startswith("deadline 2026-01-01 06:00 UTC in 48 h 0 min")


def test_the_module_is_cheap_to_import_and_loads_no_airflow_and_no_transport():
    code = (
        "import sys; import airflow_gpumarket.deadlines; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'requests', 'aiohttp', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("seconds", [0.0, 1.0, 59.4])
def test_a_duration_under_a_minute_is_said_in_seconds(seconds):
    assert deadlines._span(seconds) == f"{round(seconds)} s"
