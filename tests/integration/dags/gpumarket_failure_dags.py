"""DAGs for the failure matrix: deferrable jobs and an execution_timeout, run with dag.test() on the simulator."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL}


def _dag(dag_id: str, **job) -> DAG:
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
        GpuMarketRunJobOperator(task_id="job", **COMMON, **job)
    return dag


deferred_ok = _dag("gpm_deferred_job_ok", command="echo deferred", deferrable=True)
deferred_fail = _dag("gpm_deferred_job_fails", command="echo failing; exit 4", deferrable=True)
timed_out = _dag("gpm_job_execution_timeout", command="sleep 120", execution_timeout=timedelta(seconds=3))
deferred_timed_out = _dag(
    "gpm_deferred_job_execution_timeout",
    command="sleep 120",
    deferrable=True,
    execution_timeout=timedelta(seconds=3),
)
