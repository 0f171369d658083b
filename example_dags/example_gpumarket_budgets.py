"""A fan-out under a budget: every job's worst case is reserved before it rents, and those that do not fit fail.

The DAG's budgets live in the Variable ``gpumarket_budgets`` (Admin > Variables, or
``AIRFLOW_VAR_GPUMARKET_BUDGETS``), for example ``{"example_gpumarket_budgets": {"day": 1.0, "run": 0.5}}``.
Each job's own cap is ``max_cost``: its reservation is at most that, and a job whose cost reaches it is destroyed.
The ``team:`` tag names the team the spend report counts this DAG's spend for.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
SHARDS = [f"shard-{n:03d}" for n in range(4)]

with DAG(
    dag_id="example_gpumarket_budgets",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example", "team:vision"],
) as dag:
    GpuMarketRunJobOperator.partial(
        task_id="score_shard",
        offer_filters={"num_gpus": {"gte": 1}},
        offer_order=[["dph_total", "asc"]],
        max_dph=1.0,
        image="pytorch/pytorch:latest",
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=2),
        max_cost=0.10,  # dollars per job: the most one job reserves, and where it is stopped
        on_failure_callback=destroy_rentals_on_failure,
    ).expand(command=[f'echo "scoring {shard}"' for shard in SHARDS])
