"""A nightly fine-tuning job that must be done by 06:00 UTC after its data interval, on a bid when there is room.

``deadline`` is a callable, as any templated field can be: Airflow calls it with the task's ``context`` and
``jinja_env`` when it renders the task's fields, so every retry of a run gets the same time, and tomorrow's parse
of this file compares nothing with the clock. A template works the same way:
``deadline="{{ (data_interval_end + macros.timedelta(hours=6)).isoformat() }}"``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator


def done_by_six(context, jinja_env):
    """06:00 after the end of the run's data interval (midnight UTC for this schedule)."""
    return context["data_interval_end"] + timedelta(hours=6)


with DAG(
    dag_id="example_gpumarket_nightly_deadline",
    start_date=datetime(2026, 1, 1),
    schedule="0 0 * * *",
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="fine_tune",
        offer_filters={"num_gpus": {"eq": 1}, "gpu_name": {"eq": "RTX 4090"}},
        image="pytorch/pytorch:latest",
        command='python finetune.py --resume-from "$GPUMARKET_CHECKPOINT_DIR"',
        checkpoint_dir="/workspace/checkpoints",
        interruptible=True,
        max_bid=0.30,
        expected_runtime=timedelta(hours=2),
        max_runtime=timedelta(hours=4),
        deadline=done_by_six,  # bid while one more preemption still fits before 06:00, then rent on demand
        retries=2,
        deferrable=True,
    )
