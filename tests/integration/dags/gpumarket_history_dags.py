"""DAGs for the tests of a task's history (``task_history``): a mapped task whose every instance records a rental
that ran as long as its run's conf says (``{"seconds": [60, 90]}``), after a boot of ``boot`` seconds (300) of the
image ``image`` ("img:1") on an offer of ``inet_down`` Mbps (400; null as a record of an earlier provider version), or
fails when told a negative time (with ``"record": false`` it records nothing); and a real job long enough for its
watcher to see it running."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.ui import records

#: The service's time the recorded rentals start at.
T0 = 1_800_000_000.0

with DAG("gpm_history", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):

    @task
    def lengths(**context):
        return context["dag_run"].conf.get("seconds", [60.0])

    @task
    def job(seconds: float, **context):
        if seconds < 0:
            raise RuntimeError("told to fail")
        conf = context["dag_run"].conf
        if not conf.get("record", True):
            return
        boot = conf.get("boot", 300)
        started = records.started(
            instance_id=7,
            conn_id="gpumarket_default",
            offer_id=1,
            gpu_name="RTX 4090",
            hourly_price=0.5,
            bid=None,
            created_at=T0,
            try_number=1,
            image=conf.get("image", "img:1"),
            inet_down=conf.get("inet_down", 400.0),
        )
        ran = records.ended({**started, "running_at": T0 + boot, "stopped_at": T0 + boot + seconds}, T0 + 630 + seconds)
        context["ti"].xcom_push(key=records.record_key(7), value=ran)

    job.expand(seconds=lengths())

# A real job; the second DAG's ranks offers by expected cost, learning its image's size from its earlier boots.
for _dag_id, _choice in (
    ("gpm_history_job", {}),
    ("gpm_history_learns", {"offer_choice": "expected_cost", "expected_runtime": 60}),
):
    with DAG(_dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
        GpuMarketRunJobOperator(
            task_id="train",
            command="sleep 0.5",
            offer_filters={"num_gpus": {"gte": 1}},
            image="img",
            poll_interval=float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10")),
            **_choice,
        )
