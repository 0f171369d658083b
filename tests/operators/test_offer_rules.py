"""Offer choice as pure functions (operators/chooser.py): the search, the offer taken from its answer, its worst case.

No hook: each rule is checked on a search's answer as a list of offers.
"""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.operators import chooser
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
    chosen, bid, why = chooser.next_offer([offer(1), offer(2), offer(3)], spec(), attempts)
    assert (chosen["id"], bid, why) == (2, None, "")


def test_an_offer_on_a_machine_a_preemption_took_is_skipped():
    attempts = lifecycle.Attempts(lost_machines=[101])
    assert chooser.next_offer([offer(1), offer(2)], spec(), attempts)[0]["id"] == 2


def test_an_offer_without_a_price_is_refused_because_its_worst_case_cannot_be_reserved():
    chosen, _, why = chooser.next_offer([offer(1, price=None)], spec(), lifecycle.Attempts())
    assert chosen is None and "offer 1 shows no price" in why


def test_max_dph_caps_the_price():
    chosen, _, why = chooser.next_offer([offer(1, price=0.9)], spec(max_dph=0.8), lifecycle.Attempts())
    assert chosen is None and why == "no further matching offer"


def test_an_interruptible_rental_bids_five_percent_over_the_minimum_and_searches_bids():
    interruptible = spec(interruptible=True)
    attempts = lifecycle.Attempts()
    assert chooser.search_for(interruptible, attempts)["offer_type"] == "bid"
    chosen, bid, _ = chooser.next_offer([offer(1, min_bid=0.2)], interruptible, attempts)
    assert chosen["id"] == 1 and bid == pytest.approx(0.21)
    attempts.fall_back_to_on_demand()
    assert chooser.search_for(interruptible, attempts)["offer_type"] == "ondemand"


def test_rule_a_bid_cap_below_every_offer_quotes_the_lowest_min_bid_among_them_with_its_offer():
    """Offers come cheapest on demand first, so the last one refused is a dear one: its min_bid is no guide."""
    capped = spec(interruptible=True, max_bid=0.05)
    offers = [
        offer(3100042, price=0.34, min_bid=0.136, num_gpus=1),
        offer(3100077, price=0.9, min_bid=0.15, num_gpus=2),
        offer(3101182, price=2.72, min_bid=1.2692, num_gpus=8),
    ]
    chosen, _, why = chooser.next_offer(offers, capped, lifecycle.Attempts())
    assert chosen is None
    assert "offer 3100042's min_bid $0.136/h is above the cap $0.05/h" in why and "3101182" not in why
    assert "lowest min_bid of the 3 offer(s)" in why and "raise max_bid to at least $0.136/h" in why


def test_rule_a_refusal_other_than_the_bid_cap_is_quoted_as_before():
    no_min_bid = spec(interruptible=True, max_bid=0.05)
    chosen, _, why = chooser.next_offer([offer(1), offer(2)], no_min_bid, lifecycle.Attempts())
    assert chosen is None and why == "no further matching offer (the last one refused: offer 2 shows no min_bid)"


def test_a_pinned_offer_is_searched_for_by_its_id_and_not_searched_again_once_tried():
    pinned = spec(offer_id=7)
    search = chooser.search_for(pinned, lifecycle.Attempts())
    assert search["filters"] == {"id": {"eq": 7}} and search["order"] == [["dph_total", "asc"]]
    assert chooser.search_for(pinned, lifecycle.Attempts(tried=[7])) is None
    chosen, _, why = chooser.next_offer([], pinned, lifecycle.Attempts())
    assert chosen is None and "offer_id 7 is not found by a search for it" in why


def test_the_search_asks_for_enough_offers_to_find_an_untried_one():
    attempts = lifecycle.Attempts(tried=[1, 2, 3], lost_machines=[9])
    assert chooser.search_for(spec(), attempts)["limit"] == 3 + 1 + chooser.SEARCH_MARGIN


def test_the_worst_case_is_the_price_over_the_whole_lease_with_the_disk_and_capped_by_max_cost():
    job = spec(disk=100, max_runtime=3600, boot_timeout=600)
    worst = chooser.worst_case(job, offer(1, price=1.0, storage_cost=0.1), None)
    lease_hours = (600 + 3600 + 15 * 60) / 3600
    assert worst.seconds == pytest.approx(lease_hours * 3600)
    assert worst.amount > 1.0 * lease_hours  # the disk bills too
    capped = chooser.worst_case(spec(max_cost=0.5), offer(1, price=1.0), None)
    assert capped.amount < 1.0


def test_rule_a_task_that_names_no_disk_reserves_the_services_default_8_gb():
    worst = chooser.worst_case(spec(max_runtime=3600), offer(1, price=1.0, storage_cost=72.0), None)
    disk_hourly = 8 * 72.0 / (30 * 24)  # 8 GB at $72 per GB and month: $0.80/h
    assert worst.amount == pytest.approx((1.0 + disk_hourly) * worst.seconds / 3600, rel=0.01)


# --- Renting well: host memory's skips and the expected-cost order (chooser.ordered) ---------------------------------
def test_offers_on_machines_in_host_memory_are_left_out_and_counted():
    found, lines, skipped = chooser.ordered(
        [offer(1), offer(2), offer(3, machine_id=None)], spec(), lifecycle.Attempts(), avoided={101: "x"}, model=None
    )
    assert [o["id"] for o in found] == [2, 3] and skipped == 1
    assert "1 matching offer(s) skipped" in lines[-1] and "airflow gpumarket hosts" in lines[-1]


def test_the_search_reaches_past_the_machines_host_memory_skips_and_ranks_more_offers_for_expected_cost():
    assert chooser.search_for(spec(), lifecycle.Attempts(), 4)["limit"] == 4 + chooser.SEARCH_MARGIN
    ranked = spec(offer_choice="expected_cost")
    assert chooser.search_for(ranked, lifecycle.Attempts())["limit"] == chooser.RANKED_OFFERS


def test_expected_cost_ranks_untried_priced_offers_within_max_dph_and_logs_why():
    from airflow_gpumarket.offer_cost import CostModel

    listed = [
        offer(1, price=0.20, reliability=0.05),
        offer(2, price=0.21, reliability=1.0),
        offer(3, price=0.90, reliability=1.0),  # above max_dph: never ranked
        offer(4, price=None),  # no price: never ranked
        offer(5, price=0.10, reliability=1.0),  # tried already
    ]
    found, lines, _ = chooser.ordered(
        listed,
        spec(offer_choice="expected_cost", max_dph=0.5),
        lifecycle.Attempts(tried=[5]),
        avoided={},
        model=CostModel(expected_runtime=3600),
    )
    assert [o["id"] for o in found] == [2, 1]
    assert lines[0].startswith("1. offer 2 ") and lines[-1].startswith("Chose offer 2")


def test_expected_cost_ranks_a_bid_offer_at_the_bid_it_would_be_rented_at():
    from airflow_gpumarket.offer_cost import CostModel

    bidding = spec(offer_choice="expected_cost", interruptible=True)
    listed = [offer(1, price=0.50, min_bid=0.40, reliability=1.0), offer(2, price=0.45, min_bid=0.10, reliability=1.0)]
    found, lines, _ = chooser.ordered(listed, bidding, lifecycle.Attempts(), avoided={}, model=CostModel(3600))
    assert [o["id"] for o in found] == [2, 1]
    assert "$0.105/h" in lines[0]  # min_bid plus the bid margin, not the on-demand price


def test_the_gpu_count_the_preflight_checks_is_the_offers_num_gpus():
    assert chooser.gpu_count({"num_gpus": 4}) == 4
    assert [chooser.gpu_count({"num_gpus": v}) for v in (None, 0, True, "2", -1)] == [0] * 5


def test_rule_offers_the_search_returned_against_its_filter_are_skipped_and_said():
    """The live service ignores a filter it does not apply: the offer it returns anyway is never rented."""
    listed = [offer(1, gpu_name="RTX 3090"), offer(2, gpu_name="RTX 4090")]
    found, lines, skipped = chooser.ordered(listed, spec(), lifecycle.Attempts(), avoided={}, model=None)
    assert [o["id"] for o in found] == [2] and skipped == 0
    assert "1 offer(s) the search returned do not match offer_filters" in lines[0]
    assert "offer 1: its gpu_name is 'RTX 3090', not eq 'RTX 4090'" in lines[0]
    pinned = chooser.ordered(listed, spec(offer_id=1), lifecycle.Attempts(), avoided={}, model=None)[0]
    assert [o["id"] for o in pinned] == [1, 2]  # a pinned offer's search is by its id: no filter to hold it to


def test_a_misspelt_filter_field_fails_the_dag_file_naming_the_closest_field():
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError, match="did you mean 'gpu_name'"):
        spec(offer_filters={"gpu_nmae": {"eq": "RTX 3090"}})
    assert spec(offer_filters={"gpu_nmae": {"eq": "x"}}, extra_filter_fields=["gpu_nmae"]).extra_filter_fields


@pytest.mark.parametrize(
    ("filters", "said"),
    [
        ({"gpu_name": {"equals": "RTX 4090"}}, "offer_filters['gpu_name']: operator 'equals' is not one the service"),
        ({"num_gpus": {"eq": "one"}}, "offer_filters['num_gpus']: compares with a number, got 'one'"),
        ({"rentable": {"in": True}}, "offer_filters['rentable']: 'in' takes a list"),
    ],
)
def test_rule_a_filter_with_an_unknown_operator_or_a_wrong_value_fails_the_dag_file_naming_offer_filters(filters, said):
    from airflow_gpumarket.exceptions import GpuMarketValidationError

    with pytest.raises(GpuMarketValidationError) as caught:
        spec(offer_filters=filters)
    assert str(caught.value).startswith(said)


def test_rule_templated_filter_values_wait_for_the_task_to_run_and_extra_fields_go_unchecked():
    templated = {"num_gpus": {"eq": "{{ params.gpus }}"}, "gpu_name": {"eq": "A100"}}
    assert GpuMarketRunJobOperator(task_id="t", command="c", image="i", offer_filters=templated).offer_filters
    assert spec(offer_filters={"gpu_name": {"like": 4090}}, extra_filter_fields=["gpu_name"]).offer_filters
