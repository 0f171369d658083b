"""Batch job: one GpuMarketRunJobOperator per input, mapped; each rents, runs, and destroys on its own.

Runs as-is on the embedded simulator and on the real service by changing only the connection.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
SHARDS = ["shard-000", "shard-001", "shard-002"]

with DAG(
    dag_id="example_gpumarket_batch",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator.partial(
        task_id="embed_shard",
        offer_filters={"num_gpus": {"gte": 1}, "verified": {"eq": True}},
        offer_order=[["dph_total", "asc"]],
        max_dph=2.0,
        image="pytorch/pytorch:latest",
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=1),
        log_interval=timedelta(minutes=1),  # each shard's output in its task log every minute (10 shards, one key)
        retries=1,
        # Unmapped operators add this callback themselves; partial() never runs their __init__ where Airflow's DAG
        # processor looks for it after a lost worker, so mapped tasks name it.
        on_failure_callback=destroy_rentals_on_failure,
    ).expand(command=[f'echo "embedding {shard}"; python3 -c "print(sum(range(10**6)))"' for shard in SHARDS])
