"""Interruptible rentals as pure rules (bidding.py), without a server: the bid for an offer, when to raise it, the
policy's checks when the DAG is parsed, and what a preemption leads to (the end-to-end rules are in
tests/integration/test_interruptible.py)."""

from __future__ import annotations

import re

import pytest

from airflow_gpumarket.bidding import BID_MARGIN, BidPolicy, Next, bid_cap, bid_for, held_bid, job_env
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


def test_rule_after_a_preemption_the_policy_waits_for_the_bid_fails_over_or_fails():
    policy = BidPolicy(max_preemptions=2, on_preemption="wait", max_outbid_wait=600)
    assert policy.after_preemption(1, waited=False, won_back=False, on_demand=False) is Next.WAIT
    assert policy.after_preemption(1, waited=True, won_back=False, on_demand=False) is Next.FAILOVER  # its wait ran out
    assert policy.after_preemption(3, waited=False, won_back=False, on_demand=False) is Next.FAIL  # past the limit
    failover = policy._replace(on_preemption="failover")
    assert failover.after_preemption(1, waited=False, won_back=False, on_demand=False) is Next.FAILOVER
    assert failover.after_preemption(1, waited=False, won_back=True, on_demand=False) is Next.WAIT  # a raised bid wins
    no_wait = policy._replace(max_outbid_wait=0)
    assert no_wait.after_preemption(1, waited=False, won_back=True, on_demand=False) is Next.FAILOVER


def test_rule_a_deadline_that_ends_the_bidding_turns_a_wait_or_a_failover_into_on_demand_but_not_a_failure():
    policy = BidPolicy(max_preemptions=2, on_preemption="wait", max_outbid_wait=600)
    assert policy.after_preemption(1, waited=False, won_back=True, on_demand=False, bids=False) is Next.ON_DEMAND
    assert (
        policy._replace(on_preemption="failover").after_preemption(
            2, waited=False, won_back=False, on_demand=False, bids=False
        )
        is Next.ON_DEMAND
    )
    assert policy.after_preemption(3, waited=False, won_back=False, on_demand=False, bids=False) is Next.FAIL


def test_rule_past_max_preemptions_a_rental_falls_back_to_on_demand_only_when_asked_and_only_once():
    policy = BidPolicy(max_preemptions=0, fallback_on_demand=True)
    assert policy.after_preemption(1, waited=False, won_back=False, on_demand=False) is Next.ON_DEMAND
    assert policy.after_preemption(1, waited=False, won_back=False, on_demand=True) is Next.FAIL
    assert (
        policy._replace(fallback_on_demand=False).after_preemption(1, waited=False, won_back=False, on_demand=False)
        is Next.FAIL
    )
    assert not policy.holds() and policy._replace(bid_strategy="hold").holds()
