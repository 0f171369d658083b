"""GpuMarketSearchOffersOperator (operators/search.py), with the service mocked on the wire."""

from __future__ import annotations

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator

from .conftest import BASE

OFFERS = [
    {"id": 1, "num_gpus": 1, "gpu_name": "RTX 4090", "dph_total": 0.3},
    {"id": 2, "num_gpus": 1, "gpu_name": "RTX 4090", "dph_total": 0.5},
]
CASES = [
    # (operator, arguments, the argument the message must name)
    (GpuMarketSearchOffersOperator, {"offer_filters": {"num_gpus": {"eq": 1, "gte": 2}}}, "offer_filters['num_gpus']"),
    (GpuMarketSearchOffersOperator, {"offer_filters": {"gpu_nmae": {"eq": "A"}}}, "offer_filters['gpu_nmae']"),
    (GpuMarketSearchOffersOperator, {"extra_filter_fields": "new_field"}, "extra_filter_fields"),
    (GpuMarketSearchOffersOperator, {"offer_type": "spot"}, "offer_type"),
    (GpuMarketSearchOffersOperator, {"limit": 0}, "limit"),
    (GpuMarketSearchOffersOperator, {"max_dph": 0}, "max_dph"),
]


def test_the_offers_found_are_returned_without_those_dearer_than_max_dph(requests_mock, task_log):
    requests_mock.post(f"{BASE}/api/v0/bundles/", json={"offers": OFFERS})
    op = GpuMarketSearchOffersOperator(
        task_id="t",
        offer_filters={"gpu_name": {"eq": "RTX 4090"}},
        offer_order=[["dph_total", "asc"]],
        limit=5,
        max_dph=0.4,
    )
    assert op.execute({}) == OFFERS[:1]
    sent = requests_mock.last_request.json()
    assert sent["gpu_name"] == {"eq": "RTX 4090"} and sent["limit"] == 5 and sent["type"] == "ondemand"
    assert "Found 1 offer(s)" in task_log()


def test_without_max_dph_every_offer_found_is_returned(requests_mock):
    requests_mock.post(f"{BASE}/api/v0/bundles/", json={"offers": OFFERS})
    assert GpuMarketSearchOffersOperator(task_id="t").execute({}) == OFFERS


def test_templated_arguments_are_checked_when_the_task_runs_before_anything_is_sent(requests_mock):
    op = GpuMarketSearchOffersOperator(task_id="t", offer_type="{{ params.offer_type }}")
    op.offer_type = "spot"  # as rendering would make it
    with pytest.raises(GpuMarketValidationError, match="^offer_type"):
        op.execute({})
    assert requests_mock.call_count == 0


# --- Bad input, refused when the DAG is parsed -------------------------------------------------------------


test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)
