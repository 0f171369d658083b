"""GpuMarketCreateEndpointOperator and GpuMarketDeleteDeploymentOperator (operators/serverless.py), with the
service mocked on the wire."""

from __future__ import annotations

import pytest

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator, GpuMarketDeleteDeploymentOperator

from .conftest import BASE


# --- endpoints ----------------------------------------------------------------------------------------------
def test_create_endpoint_sends_the_given_fields_and_returns_the_new_id(requests_mock):
    requests_mock.post(f"{BASE}/api/v0/endptjobs", json={"success": True, "result": 314})
    op = GpuMarketCreateEndpointOperator(
        task_id="t",
        endpoint_name="llm",
        endpoint_state="active",
        max_workers=4,
        max_queue_time=30,
        target_queue_time=10,
    )
    assert op.execute({}) == 314
    assert requests_mock.last_request.json() == {
        "endpoint_name": "llm",
        "endpoint_state": "active",
        "max_workers": 4,
        "max_queue_time": 30,
        "target_queue_time": 10,
    }


def test_rule_target_queue_time_at_most_max_queue_time_is_checked_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^target_queue_time"):
        GpuMarketCreateEndpointOperator(task_id="t", max_queue_time=5, target_queue_time=6)


def test_endpoint_state_enum_is_checked_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^endpoint_state"):
        GpuMarketCreateEndpointOperator(task_id="t", endpoint_state="paused")


def test_templated_endpoint_fields_are_checked_after_rendering(requests_mock):
    op = GpuMarketCreateEndpointOperator(task_id="t", endpoint_state="{{ params.state }}")
    op.endpoint_state = "paused"
    with pytest.raises(GpuMarketValidationError, match="^endpoint_state"):
        op.execute({})
    assert requests_mock.call_count == 0


def test_create_endpoint_is_not_resent_after_a_502(requests_mock):
    requests_mock.post(f"{BASE}/api/v0/endptjobs", status_code=502, json={"error": "bad_gateway"})
    with pytest.raises(Exception, match="502"):
        GpuMarketCreateEndpointOperator(task_id="t", endpoint_name="x").execute({})
    assert requests_mock.call_count == 1


# --- deployments ------------------------------------------------------------------------------------------
def test_delete_deployment_sends_name_and_tag_and_returns_the_count(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 2})
    assert GpuMarketDeleteDeploymentOperator(task_id="t", name="llm", tag="v1").execute({}) == 2
    assert requests_mock.last_request.json() == {"name": "llm", "tag": "v1"}


def test_delete_deployment_count_zero_succeeds_by_default(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 0})
    assert GpuMarketDeleteDeploymentOperator(task_id="t", name="llm").execute({}) == 0
    assert requests_mock.last_request.json() == {"name": "llm"}


def test_delete_deployment_count_zero_fails_with_fail_if_none(requests_mock):
    requests_mock.delete(f"{BASE}/api/v0/deployments", json={"success": True, "count": 0})
    with pytest.raises(AirflowException, match="No deployment matched name 'llm'"):
        GpuMarketDeleteDeploymentOperator(task_id="t", name="llm", fail_if_none=True).execute({})


def test_delete_deployment_without_name_is_refused_at_parse_time():
    with pytest.raises(GpuMarketValidationError, match="^name"):
        GpuMarketDeleteDeploymentOperator(task_id="t", name="")


def test_endpoint_fields_are_named_once_in_the_api_and_the_operator_takes_each():
    import inspect

    from airflow_gpumarket import api
    from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator

    keywords = set(inspect.signature(GpuMarketCreateEndpointOperator.__init__).parameters)
    assert set(api.ENDPOINT_FIELDS) <= keywords
    assert len(set(api.ENDPOINT_FIELDS)) == len(api.ENDPOINT_FIELDS) == 13
    for name in api.ENDPOINT_FIELDS:  # the docs come from the table too: one :param each
        assert GpuMarketCreateEndpointOperator.__doc__.count(f":param {name}:") == 1, name
