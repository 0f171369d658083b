"""The DAG that `make chaos` runs with `airflow dags test` and kills with SIGTERM mid-boot or mid-job."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

with DAG(dag_id="chaos_sigterm", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
    GpuMarketRunJobOperator(
        task_id="job",
        offer_filters={"num_gpus": {"gte": 1}},
        offer_order=[["dph_total", "asc"]],
        image="chaos",
        command="echo started; sleep 60",
        poll_interval=0.1,
        deferrable=False,
    )
