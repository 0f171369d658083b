"""Reaper every 10 minutes: destroys instances this provider rented whose lease (in their label) has expired.

The last line of defence when a worker vanished and neither a teardown nor the failure callback could run. One
list walk per run (plus a destroy per orphan), so it can run often: a job's lease is kept 15 minutes ahead while
its task watches it, so a job nobody watches any more stops billing within about 25 minutes. Instances rented by
hand (without the provider's `afgm-` label) are never touched.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.reaper import GpuMarketReapOrphansOperator

with DAG(
    dag_id="example_gpumarket_reaper",
    start_date=datetime(2026, 1, 1),
    schedule=timedelta(minutes=10),
    catchup=False,
    max_active_runs=1,
    tags=["gpumarket", "example", "maintenance"],
) as dag:
    GpuMarketReapOrphansOperator(task_id="reap_orphans")
