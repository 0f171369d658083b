"""DAGs for the GPU rentals page's tests: a job that ends (its rental recorded with its cost), an instance handed
to its DAG run that outlives the run (an orphan once the run ended), and one its teardown task destroys."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL}

with DAG("gpm_ui_job", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    GpuMarketRunJobOperator(task_id="train", command="echo trained", **COMMON)

with DAG("gpm_ui_handover", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    # No teardown on purpose: the run ends with its instance still alive.
    GpuMarketCreateInstanceOperator(task_id="rent", **COMMON)

with DAG("gpm_ui_create_teardown", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    rented = GpuMarketCreateInstanceOperator(task_id="rent", **COMMON)
    rented >> GpuMarketDestroyInstanceOperator(task_id="destroy", instance_id=rented.output).as_teardown(setups=rented)
