"""Offer watching as pure rules (offer_watch.py): which offers match a watcher, and when it fires."""

from __future__ import annotations

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.offer_watch import Appearances, OfferWatch

H100 = {"id": 1, "gpu_name": "H100", "dph_total": 2.0, "min_bid": 1.2, "reliability": 0.99, "machine_id": 7}
CHEAPER = {**H100, "id": 2, "dph_total": 1.8, "min_bid": 1.5}
A100 = {"id": 3, "gpu_name": "A100", "dph_total": 1.0, "min_bid": 0.6}


def test_rule_one_event_per_appearance_and_a_failed_search_is_no_news():
    watch, seen = OfferWatch({"gpu_name": {"eq": "H100"}}), Appearances()
    first = seen.observe(watch, [A100, H100, CHEAPER], 10.0)
    assert first is not None and first["offer_id"] == 2 and first["price"] == 1.8 and first["matches"] == 2
    assert seen.observe(watch, [H100], 20.0) is None  # still there: the same appearance
    assert seen.observe(watch, None, 30.0) is None  # the search failed: neither gone nor back
    assert seen.observe(watch, [H100], 40.0) is None
    assert seen.observe(watch, [A100], 50.0) is None  # gone
    again = seen.observe(watch, [H100], 60.0)
    assert again is not None and again["seen_at"] == 60.0 and again["machine_id"] == 7


def test_rule_the_caps_are_checked_on_the_services_answer():
    assert OfferWatch(max_dph=1.9).matching([H100, CHEAPER, A100]) == [A100, CHEAPER]
    assert OfferWatch(offer_type="bid", max_dph=1.3).matching([H100, CHEAPER]) == [H100]  # its bid floor
    assert OfferWatch(min_reliability=0.995).matching([H100]) == []
    assert OfferWatch().matching([{**H100, "rentable": False}]) == []


def test_the_reliability_verification_and_port_minimums_are_sent_as_filters():
    watch = OfferWatch({"num_gpus": {"gte": 8}}, min_reliability=0.98, verified=True, min_direct_ports=1)
    assert watch.search_filters() == {
        "num_gpus": {"gte": 8},
        "reliability": {"gte": 0.98},
        "verified": {"eq": True},
        "direct_port_count": {"gte": 1},
    }
    assert watch.key() == OfferWatch({"num_gpus": {"gte": 8}}, "ondemand", 5.0, 0.98, True, 1).key()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"filters": {"gpu_nmae": {"eq": "H100"}}}, "gpu_nmae"),
        ({"filters": {"num_gpus": {"eq": "eight"}}}, r"^offer_filters\['num_gpus'\]: compares with a number"),
        ({"min_reliability": "high"}, "^min_reliability"),
        ({"offer_type": "spot"}, "offer_type"),
        ({"max_dph": 0}, "max_dph"),
    ],
)
def test_a_bad_watch_is_refused_naming_the_argument(kwargs, named):
    with pytest.raises(GpuMarketValidationError, match=named):
        OfferWatch(**kwargs)
