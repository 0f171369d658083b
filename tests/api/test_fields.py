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


def test_rule_a_filter_on_a_field_the_service_does_not_filter_on_is_refused_with_the_closest_name():
    """The service ignores an unknown field: ``gpu_nmae`` would match every GPU, so it is refused before a search."""
    with pytest.raises(GpuMarketValidationError, match="did you mean 'gpu_name'") as caught:
        api.build_search_body({"gpu_nmae": {"eq": "RTX 3090"}})
    assert caught.value.field == "filters['gpu_nmae']" and "extra_filter_fields" in str(caught.value)
    with pytest.raises(GpuMarketValidationError, match="every offer; A field newer"):  # nothing close: no guess
        api.build_search_body({"zzz": {"eq": 1}})


def test_a_field_newer_than_the_provider_is_sent_when_named_in_extra_fields():
    body = api.build_search_body({"new_field": {"gte": 2}, "gpu_name": {"eq": "A"}}, extra_fields=("new_field",))
    assert body == {"new_field": {"gte": 2}, "gpu_name": {"eq": "A"}, "type": "ondemand"}
    for bad in ("new_field", [""], [3]):
        with pytest.raises(GpuMarketValidationError, match="^extra_filter_fields: must be a list"):
            api.require_field_names("extra_filter_fields", bad)


def test_the_spec_and_the_official_clients_filter_fields_are_all_known():
    spec_fields = {"gpu_name", "num_gpus", "gpu_ram", "reliability", "verified", "rentable", "direct_port_count"}
    assert spec_fields | {"dph_total", "inet_down_cost", "geolocation", "cuda_max_good"} <= api.OFFER_FILTER_FIELDS


@pytest.mark.parametrize(
    ("offer", "filters", "said"),
    [
        ({"gpu_name": "RTX 3090"}, {"gpu_name": {"eq": "RTX 4090"}}, "its gpu_name is 'RTX 3090', not eq 'RTX 4090'"),
        ({"num_gpus": 1}, {"num_gpus": {"gte": 2}}, "its num_gpus is 1, not gte 2"),
        ({"gpu_name": "B"}, {"gpu_name": {"in": ["A", "C"]}}, "its gpu_name is 'B', not in ['A', 'C']"),
        ({"dph_total": 0.9}, {"dph_total": {"lte": 0.5}}, "its dph_total is 0.9, not lte 0.5"),
        ({"num_gpus": 2}, {"num_gpus": {"gte": 2}, "gpu_name": {"eq": "A"}}, None),  # a field it lacks: no verdict
        ({"num_gpus": "2"}, {"num_gpus": {"gte": 2}}, None),  # not comparable: no verdict
        ({"num_gpus": 2}, {"num_gpus": {"near": 2}}, None),  # an operator not known here: no verdict
    ],
)
def test_an_offer_that_contradicts_its_filter_is_said_to(offer, filters, said):
    assert api.filter_mismatch(offer, filters) == said


def test_rule_an_unknown_filter_operator_is_refused_naming_the_closest_and_the_known_ones():
    """The service refuses an operator it does not know only when the search is sent; it is refused before."""
    with pytest.raises(GpuMarketValidationError, match="did you mean 'eq'") as caught:
        api.build_search_body({"gpu_name": {"equals": "RTX 4090"}})
    assert caught.value.field == "filters['gpu_name']" and "eq, gte, in" in caught.value.problem
    with pytest.raises(GpuMarketValidationError, match="did you mean 'gte'"):  # the official client's spelling
        api.build_search_body({"num_gpus": {">=": 2}})
    for operator in (*api.FILTER_OPERATORS, "neq", "gt", "lt", "lte", "notin"):  # the spec's and the live service's
        value = [1] if operator in ("in", "notin") else 1
        assert api.build_search_body({"num_gpus": {operator: value}})["num_gpus"] == {operator: value}


@pytest.mark.parametrize(
    ("filters", "said"),
    [
        ({"num_gpus": {"eq": "one"}}, "compares with a number, got 'one' (str)"),
        ({"num_gpus": {"gte": True}}, "compares with a number, got True (bool)"),
        ({"gpu_name": {"eq": 4090}}, "compares with text, got 4090 (int)"),
        ({"gpu_name": {"eq": ["A100", "H100"]}}, "for several values use {'in': [...]}"),
        ({"gpu_name": {"notin": ["A100", 3]}}, "got 3 (int)"),
        ({"verified": {"eq": "yes"}}, "compares with True or False, got 'yes' (str)"),
        ({"gpu_name": {"in": "A100"}}, "'in' takes a list of values"),
        ({"gpu_name": {"notin": "A100"}}, "'notin' takes a list of values"),
    ],
)
def test_rule_a_filter_value_of_the_wrong_kind_for_its_field_is_refused(filters, said):
    with pytest.raises(GpuMarketValidationError) as caught:
        api.build_search_body(filters)
    assert caught.value.field == f"filters[{next(iter(filters))!r}]" and said in caught.value.problem


def test_rule_filter_values_of_their_fields_kind_and_fields_the_spec_types_not_are_sent():
    filters = {
        "num_gpus": {"gte": 2},
        "dph_total": {"lte": 0.5},
        "gpu_name": {"in": ["A100 SXM4", "H100 SXM"]},
        "verified": {"eq": True},
        "gpu_ram": {"gte": "24000"},  # a rendered template's text: the live service reads it as a number
        "geolocation": {"eq": 7},  # no type in the spec: the service judges it
    }
    assert api.build_search_body(filters) == {**filters, "type": "ondemand"}


def test_rule_a_field_named_in_extra_filter_fields_is_sent_with_its_operator_and_value_unchecked():
    filters = {"gpu_name": {"near": 4090}, "new_field": {"between": "1-2"}}
    body = api.build_search_body(filters, extra_fields=("gpu_name", "new_field"))
    assert body == {**filters, "type": "ondemand"}


def test_rule_filter_errors_name_the_argument_the_caller_gave():
    with pytest.raises(GpuMarketValidationError, match=r"^offer_filters\['num_gpus'\]: compares with a number"):
        api.build_search_body({"num_gpus": {"eq": "one"}}, argument="offer_filters")
    with pytest.raises(GpuMarketValidationError, match=r"^offer_filters: must be an object .* got str"):
        api.build_search_body("gpu_name=A100", argument="offer_filters")  # type: ignore[arg-type]
    with pytest.raises(GpuMarketValidationError, match="pass it as the offer_order argument"):
        api.build_search_body({"order": {"eq": "x"}}, argument="offer_filters")
