"""GpuMarketBaseOperator (operators/base.py): the connection and a hook made once per operator. Its other rule, a
retry_policy of None accepted before Airflow 3.3, is pinned in tests/test_retry_policy.py."""

from __future__ import annotations

from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator


def test_the_hook_is_made_once_per_operator_for_its_connection():
    default = GpuMarketSearchOffersOperator(task_id="a")
    other = GpuMarketSearchOffersOperator(task_id="b", gpumarket_conn_id="gpumarket_eu")
    assert default.hook is default.hook and default.hook.gpumarket_conn_id == "gpumarket_default"
    assert other.hook.gpumarket_conn_id == "gpumarket_eu"
