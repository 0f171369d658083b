"""DAGs for interruptible rentals, run with dag.test() on the simulator while a test outbids their instances."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL, "interruptible": True}
#: Finishes on the third run (after two preemptions); sleeps until killed on the others.
THIRD_RUN_FINISHES = (
    'echo "run attempt=$GPUMARKET_ATTEMPT preemptions=$GPUMARKET_PREEMPTIONS"; '
    '[ "$GPUMARKET_ATTEMPT" -ge 3 ] || sleep 60; echo "finished on attempt $GPUMARKET_ATTEMPT"'
)

with DAG("gpm_interruptible_deferred", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as deferred:
    GpuMarketRunJobOperator(task_id="train", command=THIRD_RUN_FINISHES, deferrable=True, **COMMON)


for dag_id, deferrable in (("gpm_interruptible_decorated", True), ("gpm_interruptible_decorated_sync", False)):
    with DAG(dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False):

        @task.gpumarket(deferrable=deferrable, **COMMON)
        def train() -> dict:
            import os
            import time

            attempt = int(os.environ["GPUMARKET_ATTEMPT"])
            print(f"run attempt={attempt}", flush=True)
            if attempt < 3:
                time.sleep(60)  # the job's work on its first two rentals: the test's outbid kills it
            return {"attempt": attempt, "preemptions": int(os.environ["GPUMARKET_PREEMPTIONS"])}

        train()


with DAG("gpm_interruptible_wait_deferred", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    # The instance's disk survives an outbid: a marker file there is the job's checkpoint. On resume the script
    # runs again on the same instance, finds it, and finishes once the test lets it (the ".go" file).
    GpuMarketRunJobOperator(
        task_id="train",
        command=(
            'echo "run attempt=$GPUMARKET_ATTEMPT"; [ -f "$GPUMARKET_TEST_MARKER" ] && '
            '{ until [ -f "$GPUMARKET_TEST_MARKER.go" ]; do sleep 0.05; done; echo resumed; exit 0; }; '
            'touch "$GPUMARKET_TEST_MARKER"; echo checkpointed; sleep 60'
        ),
        env={"GPUMARKET_TEST_MARKER": os.environ.get("GPUMARKET_TEST_MARKER", "/tmp/gpm-wait-marker")},
        deferrable=True,
        on_preemption="wait",
        max_outbid_wait=600,
        **COMMON,
    )
