"""Interruptible training: rent bid instances below the on-demand price, survive outbids, resume from a checkpoint.

The job writes its checkpoints to ``$GPUMARKET_CHECKPOINT_DIR`` (``checkpoint_dir`` on the instance). After a
preemption the operator keeps the paused instance, rents another machine, has the service copy the checkpoint
directory across, and runs the job again with ``GPUMARKET_ATTEMPT`` one higher; the job starts from the last
checkpoint it wrote. No bucket and no credential are involved. It must be done within eight hours of its start: it
bids while one more preemption would still leave time to finish on demand, and rents on demand from then on.

Runs as-is on the embedded simulator and on the real service by changing only the connection.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
#: Ten epochs, a checkpoint after each (written to epoch.tmp, then renamed: a copy never sees half a file).
TRAIN = """
ck="$GPUMARKET_CHECKPOINT_DIR"
epoch=$(cat "$ck/epoch" 2>/dev/null || echo 0)
echo "attempt $GPUMARKET_ATTEMPT (after $GPUMARKET_PREEMPTIONS preemptions) resumes at epoch $epoch"
echo "checkpoint restored from: ${GPUMARKET_RESUMED_FROM:-nothing}"
while [ "$epoch" -lt 10 ]; do
  sleep 1 || exit 143
  epoch=$((epoch+1))
  echo "$epoch" > "$ck/epoch.tmp" && mv "$ck/epoch.tmp" "$ck/epoch"
  echo "epoch $epoch done"
done
"""

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
        command=TRAIN,
        checkpoint_dir="/workspace/checkpoints",  # kept across preemptions; the job sees $GPUMARKET_CHECKPOINT_DIR
        interruptible=True,
        max_bid=0.30,  # $/h, never more; the bid is the offer's min_bid + 5 %
        max_preemptions=3,
        on_preemption="failover",
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=2),
        expected_runtime=timedelta(hours=1),
        deadline=timedelta(hours=8),  # from the try's start: bid while a preemption fits, then rent on demand
        deferrable=True,
    )
