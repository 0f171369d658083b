"""Rent the offer that is cheapest to finish on, not the cheapest per hour, and never a host that failed lately.

`offer_choice="expected_cost"` ranks the matching offers by what the whole job is expected to cost on each: its
price over the boot (from the image's size and the host's download speed) and the runtime, the disk, and the risk of
a failed attempt from the offer's reliability. The task log lists the top offers and why the chosen one won.
Before `train.py` starts, the job wrapper checks that the GPUs the offer promised are visible and runs `preflight`;
a host that fails either is destroyed within seconds, remembered for a day (host memory, shared by every task on the
same API key), and the task rents the next offer.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.retry_policy import gpumarket_retry_policy

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))

with DAG(
    dag_id="example_gpumarket_rent_well",
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    tags=["example", "gpumarket"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={"gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": 2}},
        max_dph=1.5,
        offer_choice="expected_cost",
        expected_runtime=timedelta(hours=3),  # without it: the median of this task's earlier successful runs
        image="pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
        image_size_gb=6,  # without it: what this task's earlier boots of the image imply
        transfer_gb={"in": 20, "out": 2},  # priced at each offer's bandwidth prices
        disk=64,
        preflight="python -c 'import torch; assert torch.cuda.device_count() == 2'",
        command="python train.py --epochs 3",
        max_runtime=timedelta(hours=6),
        max_offer_attempts=5,
        poll_interval=POLL_SECONDS,
        retries=2,
        retry_policy=gpumarket_retry_policy(retry_delay=timedelta(minutes=10)),
    )
