"""Request bodies and the tables they are built from (``api/fields.py``): the endpoint fields, the offer query and
the creation fields."""

from __future__ import annotations

import pytest

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError


def test_endpoint_body_rejects_an_unknown_field():
    with pytest.raises(GpuMarketValidationError) as caught:
        api.build_endpoint_body(endpoint_name="x", max_worker=3)
    assert caught.value.field == "max_worker"
    assert "not an endpoint field" in str(caught.value)


def test_offer_query_builds_one_operator_per_field():
    query = api.OfferQuery()
    result = query.eq("gpu_name", "RTX 4090").gte("num_gpus", 2).is_in("direct_port_count", iter([1, 2]))

    assert result is query
    assert query.filters == {
        "gpu_name": {"eq": "RTX 4090"},
        "num_gpus": {"gte": 2},
        "direct_port_count": {"in": [1, 2]},
    }
    assert api.build_search_body(query.filters) == {**query.filters, "type": "ondemand"}
