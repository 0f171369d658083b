"""The DAG that `make fleet` (bench/fleet.py) runs on a production-shaped deployment against the simulator.

One DAG, `fleet`, with two mapped GpuMarketRunJobOperator tasks on the one API key of `gpumarket_default`:
`deferred` (GPUMARKET_FLEET_DEFERRED of them, deferrable) and `sync` (GPUMARKET_FLEET_SYNC, each holding a worker
slot). Map index i of a task rents only offers whose `gpu_name` is `fleet-<task>-<i>` (bench/fleet.py writes two
per task instance), so a second rental of one task instance shows as a second instance of its GPU name.

Each job sleeps GPUMARKET_FLEET_JOB_SECONDS and prints, as its last line, `fleet-end <epoch seconds>`: the moment
its work ended, from which bench/fleet.py measures the time to the task's success.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

COUNTS = {
    "deferred": int(os.environ.get("GPUMARKET_FLEET_DEFERRED", "200")),
    "sync": int(os.environ.get("GPUMARKET_FLEET_SYNC", "20")),
}
JOB_SECONDS = int(os.environ.get("GPUMARKET_FLEET_JOB_SECONDS", "60"))
END_MARK = "fleet-end"


def gpu_name(task_id: str, map_index: int) -> str:
    return f"fleet-{task_id}-{map_index:03d}"


with DAG(
    dag_id="fleet",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    max_active_runs=1,
    max_active_tasks=sum(COUNTS.values()),
    tags=["gpumarket-fleet"],
):
    for _task_id, _count in COUNTS.items():
        GpuMarketRunJobOperator.partial(
            task_id=_task_id,
            deferrable=_task_id == "deferred",
            image="fleet",
            retries=0,
            on_failure_callback=destroy_rentals_on_failure,  # a mapped task needs it passed (see the README)
            boot_timeout=timedelta(minutes=10),
            max_runtime=timedelta(minutes=30),
        ).expand_kwargs(
            [
                {
                    "offer_filters": {"gpu_name": {"eq": gpu_name(_task_id, i)}},
                    "command": f"echo fleet job {_task_id} {i}; sleep {JOB_SECONDS}; echo {END_MARK} $(date +%s.%N)",
                }
                for i in range(_count)
            ]
        )
