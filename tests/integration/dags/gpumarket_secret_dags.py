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
            poll_interval=POLL,
            log_interval=4 * POLL,
            **job,
        )
    return dag


#: Secrets from Airflow, and a private image's registry login.
SECRETS = {
    "image": "registry.example.com/team/private:1",
    "command": PRINTS_SECRETS,
    "env": {"PLAIN": "not-a-secret"},
    "secrets": {"HF_TOKEN": "variable:gpm_hf_token", "REGISTRY_PASS": "connection:gpm_registry"},
    "registry_conn_id": "gpm_registry",
}
#: A token put in env (the way secrets= replaces), beside a setting whose name merely starts like one.
ENV_SECRET = {
    "image": "img",
    "command": 'echo "token=$HF_TOKEN"; echo "parallel=$TOKENIZERS_PARALLELISM"',
    "env": {"HF_TOKEN": "{{ var.value.gpm_hf_token }}", "TOKENIZERS_PARALLELISM": "false"},
}

secrets_sync = _dag("gpm_secrets_sync", deferrable=False, **SECRETS)
secrets_deferred = _dag("gpm_secrets_deferred", deferrable=True, **SECRETS)
env_secret_sync = _dag("gpm_env_secret_sync", deferrable=False, **ENV_SECRET)
env_secret_deferred = _dag("gpm_env_secret_deferred", deferrable=True, **ENV_SECRET)
