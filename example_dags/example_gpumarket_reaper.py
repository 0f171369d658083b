"""Hourly reaper: destroys instances this provider rented whose lease (written in their label) has expired.

The last line of defence when a worker vanished before any teardown could run. Instances rented by hand (without
the provider's `afgm-` label) are never touched.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_gpumarket.operators.instances import GpuMarketReapOrphansOperator

with DAG(
    dag_id="example_gpumarket_reaper",
    start_date=datetime(2026, 1, 1),
    schedule="@hourly",
    catchup=False,
    max_active_runs=1,
    tags=["gpumarket", "example", "maintenance"],
) as dag:
    GpuMarketReapOrphansOperator(task_id="reap_orphans")
