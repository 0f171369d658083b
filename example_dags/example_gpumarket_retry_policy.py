"""Retries that know a bad job from a bad market: the provider's retry policy (Airflow 3.3+).

A job whose command fails (a bug in `train.py`, exit 3) fails at once: renting another GPU would run the same bug
again. A rental that never got going (no offer under `max_dph`, every one taken, hosts that failed or booted too
slowly, preemptions past `max_preemptions`, the service's errors after the hook's own retries) is retried after
`retry_delay`. Arguments or a key the service refuses fail at once. On Airflow before 3.3 `gpumarket_retry_policy()`
is None and the task's standard retries apply.

The command comes from the run's configuration, so a run can try another one:
`airflow dags trigger example_gpumarket_retry_policy --conf '{"command": "python train.py --epochs 1"}'`.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.retry_policy import gpumarket_retry_policy

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))

with DAG(
    dag_id="example_gpumarket_retry_policy",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params={"command": "python train.py --epochs 3"},
    tags=["example", "gpumarket"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={"num_gpus": {"gte": 1}, "reliability": {"gte": 0.9}},
        max_dph=2.0,
        image="pytorch/pytorch:latest",
        command="{{ params.command }}",
        max_runtime=timedelta(hours=2),
        poll_interval=POLL_SECONDS,
        retries=3,
        retry_delay=timedelta(minutes=1),
        retry_policy=gpumarket_retry_policy(retry_delay=timedelta(minutes=10)),
    )
