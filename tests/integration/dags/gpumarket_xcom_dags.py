"""DAGs whose arguments come from upstream tasks (XComArg, ``.output``) or from ``expand()``: accepted when the DAG
is parsed, checked once resolved, before anything billable is sent."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
START = datetime(2026, 1, 1)


@task
def filters() -> dict:
    return {"num_gpus": {"gte": 1}}


@task
def disk_gb(size: float) -> float:
    return size


@task
def job_command() -> str:
    return "echo from-xcom"


@task
def sizes() -> list:
    return [10, 12]


@task
def price_of_first(offers: list) -> float:
    return offers[0]["dph_total"]


@task
def id_of_second(offers: list) -> int:
    return offers[1]["id"]


with DAG(dag_id="gpm_xcom_arguments", start_date=START, schedule=None, catchup=False) as xcom_arguments:
    chosen = filters()
    search = GpuMarketSearchOffersOperator(task_id="search", offer_filters=chosen, limit=3)
    job = GpuMarketRunJobOperator(
        task_id="job",
        offer_filters=chosen,
        max_dph=price_of_first(search.output),
        image="img",
        disk=disk_gb(16),
        command=job_command(),
        poll_interval=POLL,
    )
    created = GpuMarketCreateInstanceOperator(
        task_id="create",
        offer_id=id_of_second(search.output),
        image="img",
        env={"RUN": job_command()},
        poll_interval=POLL,
    )
    created >> GpuMarketDestroyInstanceOperator(task_id="destroy", instance_id=created.output).as_teardown(
        setups=created
    )
    GpuMarketRunJobOperator.partial(
        task_id="mapped", offer_filters=chosen, image="img", command="echo mapped", poll_interval=POLL
    ).expand(disk=sizes())

with DAG(dag_id="gpm_xcom_bad_argument", start_date=START, schedule=None, catchup=False) as xcom_bad_argument:
    GpuMarketRunJobOperator(
        task_id="job", offer_filters=filters(), image="img", disk=disk_gb(-1), command="echo x", poll_interval=POLL
    )
