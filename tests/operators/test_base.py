"""GpuMarketBaseOperator (operators/base.py): the connection, taken by every operator, and one hook per operator."""

from __future__ import annotations

import pytest

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.reaper import GpuMarketReapOrphansOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator
from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator, GpuMarketDeleteDeploymentOperator
from airflow_gpumarket.operators.service import GpuMarketServiceOperator
from airflow_gpumarket.operators.spend_report import GpuMarketSpendReportOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator, GpuMarketStopInstanceOperator
from airflow_gpumarket.operators.volumes import GpuMarketCreateVolumeListingOperator

RENTING = {"offer_filters": {}, "image": "img"}
OPERATORS = [
    (GpuMarketCreateInstanceOperator, RENTING),
    (GpuMarketRunJobOperator, {**RENTING, "command": "true"}),
    (GpuMarketServiceOperator, {**RENTING, "command": "true"}),
    (GpuMarketReapOrphansOperator, {}),
    (GpuMarketSearchOffersOperator, {}),
    (GpuMarketCreateEndpointOperator, {"endpoint_name": "e"}),
    (GpuMarketDeleteDeploymentOperator, {"name": "d"}),
    (GpuMarketSpendReportOperator, {}),
    (GpuMarketStopInstanceOperator, {"instance_id": 1}),
    (GpuMarketDestroyInstanceOperator, {"instance_id": 1}),
    (GpuMarketCreateVolumeListingOperator, {"machine": 1}),
]


@pytest.mark.parametrize(("operator", "arguments"), OPERATORS, ids=lambda o: getattr(o, "__name__", ""))
def test_every_operator_takes_its_connection_and_defaults_to_gpumarket_default(operator, arguments):
    assert operator(task_id="a", **arguments).gpumarket_conn_id == "gpumarket_default"
    assert operator(task_id="b", gpumarket_conn_id="gpumarket_eu", **arguments).hook.gpumarket_conn_id == "gpumarket_eu"


def test_the_hook_is_made_once_per_operator_for_its_connection():
    default = GpuMarketSearchOffersOperator(task_id="a")
    assert default.hook is default.hook and default.hook.gpumarket_conn_id == "gpumarket_default"


def test_every_operator_of_the_provider_is_in_the_list_above():
    import airflow_gpumarket.operators.base as base

    def concrete(cls):
        for sub in cls.__subclasses__():
            if not sub.__name__.startswith("_") and sub.__module__.startswith("airflow_gpumarket"):
                yield sub
            yield from concrete(sub)

    listed = {operator for operator, _ in OPERATORS}
    renting_bases = {"GpuMarketRentingBaseOperator"}
    assert {c for c in concrete(base.GpuMarketBaseOperator) if c.__name__ not in renting_bases} == listed
