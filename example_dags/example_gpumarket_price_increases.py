"""Daily check: fail (so the DAG's alerting fires) when hosts asked for price increases on our contracts."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.sensors.price_increases import GpuMarketPendingPriceIncreaseSensor

with DAG(
    dag_id="example_gpumarket_price_increases",
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    tags=["gpumarket", "example", "maintenance"],
) as dag:
    GpuMarketPendingPriceIncreaseSensor(task_id="check_price_increases", mode="alert", check_once=True)
