"""Interruptible rentals, without a server: the bid for an offer, the policy's checks at parse time, and how a
preemption is told from the job's own stop (the end-to-end rules are in tests/integration/test_interruptible.py)."""

from __future__ import annotations

import re

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.bidding import BID_MARGIN, bid_cap, bid_for, held_bid, job_env
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

FILTERS = {"num_gpus": {"gte": 1}}


def job(**kwargs) -> GpuMarketRunJobOperator:
    kwargs.setdefault("offer_filters", FILTERS)
    return GpuMarketRunJobOperator(task_id="t", image="img", command="python train.py", interruptible=True, **kwargs)


def test_rule_the_bid_is_min_bid_plus_the_margin_capped_by_max_bid_and_the_on_demand_price():
    offer = {"id": 1, "min_bid": 0.2, "dph_total": 0.5}
    assert bid_for(offer, None) == (round(0.2 * (1 + BID_MARGIN), 4), "")
    assert bid_for(offer, 0.205) == (0.205, "")  # the cap wins over the margin
    assert bid_for({**offer, "dph_total": 0.2}, None) == (0.2, "")  # never above the on-demand price


@pytest.mark.parametrize(
    ("offer", "max_bid", "why"),
    [
        ({"id": 1, "dph_total": 0.5}, None, "shows no min_bid"),
        ({"id": 1, "min_bid": 0.2}, None, "no on-demand price to cap the bid"),
        ({"id": 1, "min_bid": 0.2, "dph_total": 0.5}, 0.1, "min_bid \\$0.2/h is above the cap \\$0.1/h"),
    ],
)
def test_rule_no_bid_is_ever_made_without_a_price(offer, max_bid, why):
    bid, reason = bid_for(offer, max_bid)
    assert bid is None
    assert re.search(why, reason)


@pytest.mark.parametrize(
    ("bid", "min_bid", "cap", "held"),
    [
        (0.21, 0.20, 0.5, None),  # more than half the margin left: no call
        (0.21, 0.205, 0.5, round(0.205 * (1 + BID_MARGIN), 4)),  # the margin half eaten: raised to the full margin
        (0.21, 0.30, 0.5, 0.315),  # outbid: bid again to win the machine back
        (0.21, 0.30, 0.31, 0.31),  # never above the cap
        (0.21, 0.40, 0.31, None),  # no bid up to the cap wins: nothing is raised
        (0.21, None, 0.5, None),  # no minimum shown: no bid without a price
    ],
)
def test_rule_hold_raises_the_bid_when_the_machines_min_bid_rises_never_above_the_cap(bid, min_bid, cap, held):
    assert held_bid(bid, min_bid, cap) == held


def test_the_cap_of_a_bid_is_max_bid_or_the_on_demand_price_whichever_is_lower():
    assert bid_cap(None, 0.5) == 0.5 and bid_cap(0.3, 0.5) == 0.3 and bid_cap(0.9, 0.5) == 0.5
    assert bid_cap(None, None) is None


def test_the_job_learns_its_attempt_and_the_preemptions_before_it():
    assert job_env({"A": "1"}, preemptions=2) == {"A": "1", "GPUMARKET_ATTEMPT": "3", "GPUMARKET_PREEMPTIONS": "2"}


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"on_preemption": "retry"}, "on_preemption", "must be one of 'failover', 'wait'"),
        ({"max_preemptions": -1}, "max_preemptions", "at least 0"),
        ({"max_bid": 0}, "max_bid", "greater than 0"),
        ({"max_outbid_wait": -5}, "max_outbid_wait", "at least 0"),
        ({"fallback_on_demand": "yes"}, "fallback_on_demand", "true or false"),
        ({"price": 0.3}, "price", "give max_bid instead"),
        ({"log_interval": 0}, "log_interval", "tells a preemption from its own stop"),
        ({"offer_id": 7, "offer_filters": None}, "offer_id", "give offer_filters"),
        ({"bid_strategy": "max"}, "bid_strategy", "must be one of 'min', 'hold'"),
    ],
)
def test_rule_a_bad_interruptible_setting_is_refused_when_the_dag_is_parsed(kwargs, field, words):
    with pytest.raises(GpuMarketValidationError, match=words) as caught:
        job(**kwargs)
    assert caught.value.field == field


def test_max_bid_without_interruptible_is_refused_and_a_pinned_offer_may_wait():
    for setting in ({"max_bid": 0.3}, {"bid_strategy": "hold"}):
        with pytest.raises(GpuMarketValidationError, match="set interruptible=True"):
            GpuMarketRunJobOperator(task_id="t", image="i", command="c", offer_filters=FILTERS, **setting)
    assert job(offer_id=7, offer_filters=None, on_preemption="wait").bidding.on_preemption == "wait"
    GpuMarketCreateInstanceOperator(task_id="c", image="i", offer_filters=FILTERS, interruptible=True, log_interval=0)


STOPPED_NO_EXIT_LINE = {"status": "job_failed", "actual_status": "stopped", "exit_status": None, "log_read": True}


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
