"""DAGs for interruptible rentals, run with dag.test() on the simulator while a test outbids their instances."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.instances import GpuMarketRunJobOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL, "interruptible": True}
#: Finishes on the third run (after two preemptions); sleeps until killed on the others.
THIRD_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT preemptions=$GPUMARKET_PREEMPTIONS"; '
    '[ "$GPUMARKET_ATTEMPT" -ge 3 ] || sleep 60; echo "finished on attempt $GPUMARKET_ATTEMPT"'
)

with DAG("gpm_interruptible_deferred", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as deferred:
    GpuMarketRunJobOperator(task_id="train", command=THIRD_RUN_FINISHES, deferrable=True, **COMMON)


with DAG("gpm_interruptible_decorated", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as decorated:

    @task.gpumarket(deferrable=True, **COMMON)
    def train() -> dict:
        import os
        import time

        attempt = int(os.environ["GPUMARKET_ATTEMPT"])
        print(f"run attempt={attempt}", flush=True)
        if attempt < 3:
            time.sleep(60)  # the job's work on its first two rentals: the test's outbid kills it
        return {"attempt": attempt, "preemptions": int(os.environ["GPUMARKET_PREEMPTIONS"])}

    train()
