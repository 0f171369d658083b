"""Interruptible training: rent bid instances below the on-demand price, survive outbids, resume from a checkpoint.

The job keeps its progress where every rental can read it (``CHECKPOINT_URI``; a bucket in real use, a folder on
the simulator, which runs onstart scripts on this machine) and starts from there. After a preemption the operator
destroys the instance, rents another machine and runs the job again with ``GPUMARKET_ATTEMPT`` one higher.

Runs as-is on the embedded simulator and on the real service by changing only the connection (and the URI).
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
CHECKPOINT_URI = os.environ.get("GPUMARKET_EXAMPLE_CHECKPOINT_URI", os.path.join(tempfile.gettempdir(), "gpm-ckpt"))
#: Ten epochs, a checkpoint after each; a new run starts from the last one written.
TRAIN = (
    'mkdir -p "$CHECKPOINT_URI"; epoch=$(cat "$CHECKPOINT_URI/epoch" 2>/dev/null || echo 0); '
    'echo "attempt $GPUMARKET_ATTEMPT (after $GPUMARKET_PREEMPTIONS preemptions) resumes at epoch $epoch"; '
    'while [ "$epoch" -lt 10 ]; do sleep 1 || exit 143; epoch=$((epoch+1)); echo "$epoch" > "$CHECKPOINT_URI/epoch"; '
    'echo "epoch $epoch done"; done'
)

with DAG(
    dag_id="example_gpumarket_interruptible",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={"num_gpus": {"eq": 1}, "gpu_name": {"eq": "RTX 4090"}},
        image="pytorch/pytorch:latest",
        env={"CHECKPOINT_URI": CHECKPOINT_URI + "/{{ run_id | replace(':', '_') }}"},
        command=TRAIN,
        interruptible=True,
        max_bid=0.30,  # $/h, never more; the bid is the offer's min_bid + 5 %
        max_preemptions=3,
        on_preemption="failover",
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=2),
        deferrable=True,
    )
