"""DAGs for the job-log tests: jobs that print and fail or succeed, run with dag.test() on the simulator."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL, "log_interval": 4 * POLL}
#: A line nobody can know before the job runs, then a failure.
COMPUTED_THEN_EXIT_3 = 'echo "computed $(od -An -N6 -tx1 /dev/urandom | tr -d " \\n")"; echo boom >&2; exit 3'
#: Lines printed over about two seconds of real time (many log reads), then a failure that makes a last read.
#: A job that prints the instance key, alone and as env prints it (the task log must not show it).
PRINTS_ITS_KEY = 'env; echo "$CONTAINER_API_KEY"; echo "key: $CONTAINER_API_KEY."; exit 1'
TICKS_THEN_EXIT_5 = 'for i in 1 2 3 4 5 6 7 8; do echo "tick $i"; sleep 0.25; done; exit 5'
#: A short job that succeeds before any read while it runs (the default log_interval of 30 s): its lines reach the
#: task log only through the final read of the instance it stopped.
SHORT_SUCCESS = 'echo "first $(od -An -N6 -tx1 /dev/urandom | tr -d " \\n")"; echo second; sleep 1; echo third'
#: Lines computed as the job runs, printed over about two seconds of real time (many log reads), then success.
TICKS_THEN_SUCCESS = (
    'seed=$(od -An -N3 -tx1 /dev/urandom | tr -d " \\n"); '
    'for i in $(seq 11 44); do echo "tick-$i-$seed"; sleep 0.06; done'
)


def _dag(dag_id: str, **job) -> DAG:
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
        GpuMarketRunJobOperator(task_id="job", **{**COMMON, **job})
    return dag


exit3_sync = _dag("gpm_log_exit3_sync", command=COMPUTED_THEN_EXIT_3, deferrable=False)
exit3_deferred = _dag("gpm_log_exit3_deferred", command=COMPUTED_THEN_EXIT_3, deferrable=True)
ticks_deferred = _dag("gpm_log_ticks_deferred", command=TICKS_THEN_EXIT_5, deferrable=True)
ticks_sync = _dag("gpm_log_ticks_sync", command=TICKS_THEN_EXIT_5, deferrable=False)
leaky_sync = _dag("gpm_log_leaky_sync", command=PRINTS_ITS_KEY, deferrable=False)
leaky_deferred = _dag("gpm_log_leaky_deferred", command=PRINTS_ITS_KEY, deferrable=True)
short_sync = _dag("gpm_log_short_sync", command=SHORT_SUCCESS, deferrable=False, log_interval=30)
short_deferred = _dag("gpm_log_short_deferred", command=SHORT_SUCCESS, deferrable=True, log_interval=30)
ticks_success_sync = _dag("gpm_log_ticks_success_sync", command=TICKS_THEN_SUCCESS, deferrable=False)
ticks_success_deferred = _dag("gpm_log_ticks_success_deferred", command=TICKS_THEN_SUCCESS, deferrable=True)
