"""DAGs for the secrets tests: a job that prints the secrets it was given, run with dag.test() on the simulator."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
#: Prints each secret three ways (alone, as env shows it, counted), so the test sees it arrived and was masked.
PRINTS_SECRETS = (
    'echo "token=$HF_TOKEN"; env | grep "^REGISTRY_PASS="; '
    'printf "%s" "$HF_TOKEN" | wc -c | sed "s/^ */token length /"; exit 4'
)


def _dag(dag_id: str, **job) -> DAG:
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
        GpuMarketRunJobOperator(
            task_id="job",
            offer_filters={"num_gpus": {"gte": 1}},
            image="registry.example.com/team/private:1",
            poll_interval=POLL,
            log_interval=4 * POLL,
            command=PRINTS_SECRETS,
            env={"PLAIN": "not-a-secret"},
            secrets={"HF_TOKEN": "variable:gpm_hf_token", "REGISTRY_PASS": "connection:gpm_registry"},
            registry_conn_id="gpm_registry",
            **job,
        )
    return dag


secrets_sync = _dag("gpm_secrets_sync", deferrable=False)
secrets_deferred = _dag("gpm_secrets_deferred", deferrable=True)


def _env_dag(dag_id: str, **job) -> DAG:
    """A token put in env (the way secrets= replaces), beside a setting whose name merely starts like one."""
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
        GpuMarketRunJobOperator(
            task_id="job",
            offer_filters={"num_gpus": {"gte": 1}},
            image="img",
            poll_interval=POLL,
            log_interval=4 * POLL,
            command='echo "token=$HF_TOKEN"; echo "parallel=$TOKENIZERS_PARALLELISM"',
            env={"HF_TOKEN": "{{ var.value.gpm_hf_token }}", "TOKENIZERS_PARALLELISM": "false"},
            **job,
        )
    return dag


env_secret_sync = _env_dag("gpm_env_secret_sync", deferrable=False)
env_secret_deferred = _env_dag("gpm_env_secret_deferred", deferrable=True)
