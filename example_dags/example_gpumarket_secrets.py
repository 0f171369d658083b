"""A job that needs a model-hub token and a private image: secrets from Airflow, never in the DAG file.

``secrets`` names where each value lives in Airflow (a Variable, a Connection's field); the task reads it when it
runs, masks it in Airflow by value, and sends it only in the create request, as the job's environment variable.
``registry_conn_id`` names a Connection (login, password, host) that logs the service in to the image's registry.
Set them first, e.g. ``AIRFLOW_VAR_HF_TOKEN=hf_...`` and
``AIRFLOW_CONN_PRIVATE_REGISTRY='{"conn_type": "generic", "login": "robot", "password": "...", "host": "ghcr.io"}'``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))

with DAG(
    dag_id="example_gpumarket_secrets",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="fine_tune",
        offer_filters={"gpu_name": {"in": ["RTX 4090", "RTX 3090"]}},
        max_dph=1.5,
        image="ghcr.io/our-team/trainer:2026.12",
        registry_conn_id="private_registry",  # a pull-only token for this one repository
        secrets={"HF_TOKEN": "variable:hf_token"},  # a read-only, expiring model-hub token
        env={"BASE_MODEL": "our-team/base-7b"},  # plain settings: shown in the rendered fields
        command='test -n "$HF_TOKEN" && echo "downloading $BASE_MODEL with a token"',
        max_runtime=timedelta(hours=2),
        poll_interval=POLL_SECONDS,
        deferrable=True,
    )
