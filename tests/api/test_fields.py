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


def test_a_field_the_spec_does_not_name_is_refused_naming_it():
    from airflow_gpumarket import api

    with pytest.raises(GpuMarketValidationError, match="gpu_count: is not a creation field of the spec"):
        api.build_create_instance_body(image="img", gpu_count=2)


def test_the_readmes_table_of_creation_fields_is_written_from_the_api_table():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "readme_fields.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
