"""Offer choice as pure functions (operators/offers.py): the search, the offer taken from its answer, its worst case.

No hook: each rule is checked on a search's answer as a list of offers.
"""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.operators import offers
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import RentalSpec

FILTERS = {"gpu_name": {"eq": "RTX 4090"}}


def spec(**kwargs) -> RentalSpec:
    kwargs.setdefault("offer_filters", None if "offer_id" in kwargs else FILTERS)
    return RentalSpec.of(GpuMarketRunJobOperator(task_id="t", command="python t.py", image="i", **kwargs))


def offer(offer_id: int, price: float | None = 0.5, **fields) -> dict:
    return {"id": offer_id, "dph_total": price, "machine_id": 100 + offer_id, **fields}


def test_the_cheapest_untried_offer_is_taken_and_one_tried_before_never_again():
    attempts = lifecycle.Attempts(tried=[1])
    chosen, bid, why = offers.next_offer([offer(1), offer(2), offer(3)], spec(), attempts)
    assert (chosen["id"], bid, why) == (2, None, "")


def test_an_offer_on_a_machine_a_preemption_took_is_skipped():
    attempts = lifecycle.Attempts(lost_machines=[101])
    assert offers.next_offer([offer(1), offer(2)], spec(), attempts)[0]["id"] == 2


def test_an_offer_without_a_price_is_refused_because_its_worst_case_cannot_be_reserved():
    chosen, _, why = offers.next_offer([offer(1, price=None)], spec(), lifecycle.Attempts())
    assert chosen is None and "offer 1 shows no price" in why


def test_max_dph_caps_the_price():
    chosen, _, why = offers.next_offer([offer(1, price=0.9)], spec(max_dph=0.8), lifecycle.Attempts())
    assert chosen is None and why == "no further matching offer"


def test_an_interruptible_rental_bids_five_percent_over_the_minimum_and_searches_bids():
    interruptible = spec(interruptible=True)
    attempts = lifecycle.Attempts()
    assert offers.search_for(interruptible, attempts)["offer_type"] == "bid"
    chosen, bid, _ = offers.next_offer([offer(1, min_bid=0.2)], interruptible, attempts)
    assert chosen["id"] == 1 and bid == pytest.approx(0.21)
    attempts.fall_back_to_on_demand()
    assert offers.search_for(interruptible, attempts)["offer_type"] == "ondemand"


def test_a_pinned_offer_is_searched_for_by_its_id_and_not_searched_again_once_tried():
    pinned = spec(offer_id=7)
    search = offers.search_for(pinned, lifecycle.Attempts())
    assert search["filters"] == {"id": {"eq": 7}} and search["order"] == [["dph_total", "asc"]]
    assert offers.search_for(pinned, lifecycle.Attempts(tried=[7])) is None
    chosen, _, why = offers.next_offer([], pinned, lifecycle.Attempts())
    assert chosen is None and "offer_id 7 is not found by a search for it" in why


def test_the_search_asks_for_enough_offers_to_find_an_untried_one():
    attempts = lifecycle.Attempts(tried=[1, 2, 3], lost_machines=[9])
    assert offers.search_for(spec(), attempts)["limit"] == 3 + 1 + offers.SEARCH_MARGIN


def test_the_worst_case_is_the_price_over_the_whole_lease_with_the_disk_and_capped_by_max_cost():
    job = spec(disk=100, max_runtime=3600, boot_timeout=600)
    worst = offers.worst_case(job, offer(1, price=1.0, storage_cost=0.1), None)
    lease_hours = (600 + 3600 + 15 * 60) / 3600
    assert worst.seconds == pytest.approx(lease_hours * 3600)
    assert worst.amount > 1.0 * lease_hours  # the disk bills too
    capped = offers.worst_case(spec(max_cost=0.5), offer(1, price=1.0), None)
    assert capped.amount < 1.0
