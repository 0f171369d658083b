"""A renting task's wait for an offer (wait_for_offer) against the simulator: deferred, then rent, fail or fall back.

The market is the simulator's with a swing: ``listed: 0`` takes every swinging offer off the market, ``None`` puts
them back. The trigger's wait runs in this process, as a triggerer would run it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from airflow_gpumarket._compat import TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.failures import GpuMarketNoWorkingOffer
from airflow_gpumarket.triggers.offer_wait import GpuMarketOfferWaitTrigger

from .conftest import alive
from .test_money_safety import context, healthy_market, job  # noqa: F401 (an autouse fixture)

GPU = "H100 SXM"
FILTERS = {"gpu_name": {"eq": GPU}}


def off_the_market(sim) -> None:
    ids = [o["id"] for o in sim.state()["offers"] if o["gpu_name"] == GPU]
    sim.set_market_swing({"preset": "typical", "listed": 0.0, "offers": ids})


def waits(op) -> tuple[TaskDeferred, dict]:
    """The task defers to its wait; the trigger's event (as a triggerer would fire it)."""
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    assert isinstance(deferred.value.trigger, GpuMarketOfferWaitTrigger)
    return deferred.value, asyncio.run(first_event(deferred.value.trigger))


def test_rule_a_task_that_finds_no_offer_waits_in_the_triggerer_until_one_appears(sim, task_log):
    off_the_market(sim)
    op = job(offer_filters=FILTERS, deferrable=True, wait_for_offer=timedelta(hours=6))
    with pytest.raises(TaskDeferred) as deferred:  # nothing matches: the task waits, having rented nothing
        op.execute(context())
    assert sim.state()["instances"] == [] and "No offer to rent yet: waiting up to" in task_log()
    trigger = deferred.value.trigger
    assert isinstance(trigger, GpuMarketOfferWaitTrigger) and deferred.value.method_name == "execute_after_wait"
    sim.set_market_swing(None)  # the offers are back
    event = asyncio.run(first_event(GpuMarketOfferWaitTrigger(**trigger.serialize()[1])))
    assert event["status"] == "offer" and event["gpu_name"] == GPU and event["offer_id"] in offer_ids(sim)


async def first_event(trigger) -> dict:
    async for fired in trigger.run():
        return fired.payload
    raise AssertionError("the trigger ended without an event")


def test_rule_the_wait_rents_through_the_usual_choice_once_an_offer_appears(sim):
    off_the_market(sim)
    op = job(offer_filters=FILTERS, deferrable=True, wait_for_offer=timedelta(hours=6))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context())
    sim.set_market_swing(None)  # the offers are back
    result = resumed(op, deferred.value)
    (instance,) = sim.state()["instances"]
    assert result["job_status"] == "succeeded" and instance["offer_id"] in offer_ids(sim)
    assert alive(sim) == []


def offer_ids(sim) -> set[int]:
    return {o["id"] for o in sim.state()["offers"] if o["gpu_name"] == GPU}


def resumed(op, deferred: TaskDeferred, event: dict | None = None):
    """The task resumed after ``deferred`` (with ``event``, else its trigger's), each later wait through its trigger."""

    while True:
        event = event or asyncio.run(first_event(deferred.trigger))
        try:
            return getattr(op, deferred.method_name)(context(), event)
        except TaskDeferred as again:
            deferred, event = again, None


def test_rule_a_wait_that_ends_with_no_offer_fails_having_rented_nothing(sim):
    off_the_market(sim)
    op = job(offer_filters=FILTERS, deferrable=True, wait_for_offer=0.5)
    deferred, event = waits(op)
    assert event == {"status": "timeout"}
    with pytest.raises(GpuMarketNoWorkingOffer, match=r"appeared within wait_for_offer \(0:00:00\)"):
        getattr(op, deferred.method_name)(context(), event)
    assert sim.state()["instances"] == []


def test_rule_a_wait_that_ends_with_no_offer_rents_on_demand_up_to_the_fallback_cap(sim):
    cheapest = min(o["dph_total"] for o in sim.state()["offers"] if o["gpu_name"] == GPU)
    op = job(
        offer_filters=FILTERS,
        deferrable=True,
        interruptible=True,
        max_dph=cheapest / 10,  # no bid that cheap either
        wait_for_offer=0.5,
        on_no_offer="rent_on_demand",
        fallback_max_dph=cheapest * 2,
    )
    deferred, event = waits(op)
    assert event == {"status": "timeout"}
    result = resumed(op, deferred, event)
    (instance,) = sim.state()["instances"]
    assert result["job_status"] == "succeeded" and instance["is_bid"] is False
    assert alive(sim) == []


def test_rule_an_offer_the_task_already_refused_does_not_wake_it():
    trigger = GpuMarketOfferWaitTrigger(
        watch={"filters": FILTERS}, deadline=0, seen_offers=[1, 2], avoided_machines=[7], poll_interval=1
    )
    assert GpuMarketOfferWaitTrigger(**trigger.serialize()[1]).serialize() == trigger.serialize()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"wait_for_offer": 60, "deferrable": False}, "wait_for_offer"),
        ({"wait_for_offer": 60, "deferrable": True, "offer_id": 5, "offer_filters": None}, "wait_for_offer"),
        ({"wait_for_offer": 60, "deferrable": True, "on_no_offer": "rent_on_demand"}, "fallback_max_dph"),
        ({"wait_for_offer": 60, "deferrable": True, "fallback_max_dph": 2.0}, "fallback_max_dph"),
        ({"wait_for_offer": 60, "deferrable": True, "on_no_offer": "retry"}, "on_no_offer"),
        ({"on_no_offer": "rent_on_demand", "fallback_max_dph": 2.0}, "on_no_offer"),
    ],
)
def test_a_bad_wait_for_an_offer_is_refused_at_parse_time_naming_the_argument(kwargs, named):
    with pytest.raises(GpuMarketValidationError, match=named):
        job(**kwargs)
