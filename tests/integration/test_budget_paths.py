"""Every way a task reaches a create reserves what that rental may cost, at the offer's real price and disk.

Against the simulator: each path rents, and the ledger's reservation is compared with the offer the service shows.
"""

from __future__ import annotations

import re

import pytest

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.failures import GpuMarketBudgetExceeded, GpuMarketNoWorkingOffer

from .conftest import POLL, alive
from .test_budgets import budgets_variable, in_dag, reservations
from .test_interruptible import Outbidder, run_to_the_end
from .test_money_safety import FILTERS, cheapest_offers, context, job

DISK_GB = 200


def pinned() -> int:
    return int(cheapest_offers(1)[0]["id"])


def offer(offer_id: int, offer_type: str = "ondemand") -> dict:
    (found,) = GpuMarketHook().search_offers({"id": {"eq": offer_id}}, offer_type=offer_type)
    return found


def run_filters_on_demand(sim):
    job(disk=DISK_GB).execute(context())


def run_pinned_on_demand(sim):
    job(offer_id=pinned(), offer_filters=None, disk=DISK_GB).execute(context())


def run_filters_bid(sim):
    job(interruptible=True, disk=DISK_GB).execute(context())


def run_filters_held_bid(sim):
    job(interruptible=True, bid_strategy="hold", disk=DISK_GB).execute(context())


def run_pinned_bid(sim):
    job(offer_id=pinned(), offer_filters=None, interruptible=True, on_preemption="wait", disk=DISK_GB).execute(
        context()
    )


def run_fallback_on_demand(sim):
    command = 'echo "run attempt=$GPUMARKET_ATTEMPT"; [ "$GPUMARKET_ATTEMPT" -ge 2 ] || sleep 60; echo finished'
    op = job(command=command, interruptible=True, max_preemptions=0, fallback_on_demand=True, disk=DISK_GB)
    with Outbidder(sim, times=1):
        op.execute(context())


def run_created_instance(sim):
    from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

    created = GpuMarketCreateInstanceOperator(
        task_id="create", offer_id=pinned(), image="img", disk=DISK_GB, poll_interval=POLL, deferrable=False
    ).execute(context())
    GpuMarketDestroyInstanceOperator(task_id="destroy", instance_id=created).execute(context())


def run_deferred(sim):
    run_to_the_end(job(offer_id=pinned(), offer_filters=None, disk=DISK_GB, deferrable=True))


PATHS = [
    run_filters_on_demand,
    run_pinned_on_demand,
    run_filters_bid,
    run_filters_held_bid,
    run_pinned_bid,
    run_fallback_on_demand,
    run_created_instance,
    run_deferred,
]


@pytest.mark.parametrize("path", PATHS, ids=lambda path: path.__name__.removeprefix("run_"))
def test_rule_every_path_that_reaches_a_create_reserves_a_non_zero_worst_case(sim, path):
    path(sim)
    instances = {i["id"]: i for i in sim.state()["instances"]}
    entries = reservations()
    assert entries and len(entries) == len(instances)
    for entry in entries:
        rented = instances[entry["instance_id"]]
        shown = offer(rented["offer_id"], "bid" if rented["is_bid"] else "ondemand")
        price = rented["bid_price"] if rented["is_bid"] else shown["dph_total"]
        disk = DISK_GB * shown["storage_cost"] / 720
        assert entry["reserved"] > 0
        assert entry["hourly"] >= price + disk - 1e-6, (entry, rented)
    assert alive(sim) == []


def test_rule_a_pinned_offer_is_reserved_at_its_price_and_its_disk(sim):
    offer_id = pinned()
    job(offer_id=offer_id, offer_filters=None, disk=DISK_GB).execute(context())
    (entry,) = reservations()
    shown = offer(offer_id)
    assert entry["hourly"] == pytest.approx(shown["dph_total"] + DISK_GB * shown["storage_cost"] / 720, abs=1e-6)


def test_rule_a_pinned_offer_is_held_to_the_dags_budget(sim, monkeypatch):
    budgets_variable(monkeypatch, {"pinned_dag": {"run": 0.10}})
    with pytest.raises(GpuMarketBudgetExceeded, match=r"The run budget of DAG 'pinned_dag' is \$0.10"):
        in_dag("pinned_dag", offer_id=pinned(), offer_filters=None).execute(context())
    assert sim.state()["instances"] == [] and reservations() == []


def test_rule_a_pinned_offer_that_no_search_shows_is_not_rented(sim):
    with pytest.raises(GpuMarketNoWorkingOffer, match=r"offer_id 987654 is not found by a search for it") as caught:
        job(offer_id=987654, offer_filters=None).execute(context())
    assert "its price cannot be known" in str(caught.value)
    assert sim.state()["instances"] == [] and reservations() == []
    assert not [r for r in sim.requests() if r["method"] == "PUT" and "/asks/" in r["path"]]


def test_rule_an_offer_without_a_price_is_never_rented(sim, monkeypatch):
    real = GpuMarketHook.search_offers

    def without_prices(self, *args, **kwargs):
        return [{k: v for k, v in found.items() if k != "dph_total"} for found in real(self, *args, **kwargs)]

    monkeypatch.setattr(GpuMarketHook, "search_offers", without_prices)
    with pytest.raises(GpuMarketNoWorkingOffer, match=r"shows no price \(dph_total\)"):
        job(offer_id=pinned(), offer_filters=None).execute(context())
    with pytest.raises(GpuMarketNoWorkingOffer, match=r"shows no price \(dph_total\)"):
        job(offer_filters=FILTERS).execute(context())
    assert sim.state()["instances"] == [] and reservations() == []


def test_rule_max_cost_quotes_the_rate_reserved_after_a_deferral(sim):
    op = job(command="sleep 100000", max_cost=0.0001, disk=DISK_GB, deferrable=True)
    with pytest.raises(AirflowException, match="reached max_cost") as caught:
        run_to_the_end(op)
    (entry,) = reservations()
    quoted = re.search(r"compute at \$([\d.e-]+)/h while it ran, disk at \$([\d.e-]+)/h", str(caught.value))
    assert quoted, str(caught.value)
    assert float(quoted[1]) + float(quoted[2]) == pytest.approx(entry["hourly"]), (entry, str(caught.value))
    assert alive(sim) == []
