"""Serverless rollout: create the new endpoint, smoke-test it, and retire the previous deployment as a teardown.

The teardown runs only when its setup (the new endpoint) was created — Airflow runs a teardown when at least one
of its setups succeeded — so a failed rollout never deletes the version still serving traffic.
"""

from __future__ import annotations

from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.serverless import GpuMarketCreateEndpointOperator, GpuMarketDeleteDeploymentOperator

with DAG(
    dag_id="example_gpumarket_serverless",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params={"endpoint_name": "llm-serve-v3", "previous_deployment": "llm-serve", "previous_tag": "v1"},
    tags=["gpumarket", "example"],
) as dag:
    create = GpuMarketCreateEndpointOperator(
        task_id="create_endpoint",
        endpoint_name="{{ params.endpoint_name }}",
        endpoint_state="active",
        min_load=10,
        target_util=0.9,
        cold_mult=2.0,
        cold_workers=1,
        max_workers=8,
        max_queue_time=30,
        target_queue_time=10,
        inactivity_timeout=600,
    )

    @task
    def smoke_test(endpoint_id: int) -> None:
        print(f"endpoint {endpoint_id} created; run your own requests against it here")

    retire = GpuMarketDeleteDeploymentOperator(
        task_id="retire_previous_deployment",
        name="{{ params.previous_deployment }}",
        tag="{{ params.previous_tag }}",
    )

    smoke_test(create.output) >> retire.as_teardown(setups=create)
