"""One task rents a GPU, runs a shell command on it, and destroys the instance: GpuMarketRunJobOperator.

The task rents the cheapest offer that matches, runs ``command`` on it through the provider's onstart wrapper,
forwards the job's output to the task log, and succeeds when the command exits 0. The instance is destroyed in
every case. Runs on the embedded simulator and on the real service by changing only the connection.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

# 10 s is the spec's recommended poll interval; the simulator's clock is sped up, so tests and the demo poll faster.
POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))

with DAG(
    dag_id="example_gpumarket_run_job",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={"gpu_name": {"in": ["RTX 4090", "RTX 3090"]}, "reliability": {"gte": 0.95}},
        max_dph=1.5,  # never pay more than $1.50/h
        image="pytorch/pytorch:latest",
        env={"EPOCHS": "3"},
        command='for e in $(seq "$EPOCHS"); do echo "epoch $e"; done',
        max_runtime=timedelta(hours=2),  # the job's time limit
        poll_interval=POLL_SECONDS,
        log_interval=timedelta(seconds=30),  # new output lines reach the task log this often (the default)
        deferrable=True,  # wait in the triggerer: no worker slot held
    )
