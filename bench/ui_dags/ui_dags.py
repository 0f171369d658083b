"""The DAGs that `make ui-test` (bench/ui_browser.py) runs before it opens the GPU rentals page in a browser.

Named as a data team would name them, since the page's screenshot in the README shows them. Each rents only its
own GPU model (bench/ui_browser.py writes the offers), so the DAGs never compete for a machine:

- `nightly_finetune`: a job that runs until the test marks it failed, in a worker (not deferred), so the page shows
  it as a live rental and its task's "GPU rental" link works while it runs;
- `embeddings_batch` and `eval_sweep`: short jobs that end, so the page shows their spend (per DAG, run and day);
- `gpu_sandbox`: an instance handed to its DAG run and never destroyed (no teardown on purpose), an orphan once
  the run ended, which the test destroys from the page as an admin.

Two teams' DAGs, for the FAB auth manager's per-DAG roles (team a's reader may read `team_a_train` only, team b's
editor may read and edit `team_b_train` only) and for spend against the simulator's ledger once rentals ended:

- `team_a_train`: a job (RunJobOperator); `team_a_embed`: the same through `@task.gpumarket`;
- `team_b_train`: create -> work -> teardown (the instance lives across three tasks);
- `team_b_serve`: a deferred job that runs until the test marks it failed (its trigger destroys the instance).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, task

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator

#: DAG id -> the GPU model its offers have (bench/ui_browser.py reads this too).
GPUS = {
    "nightly_finetune": "A100_SXM4",
    "embeddings_batch": "RTX_4090",
    "eval_sweep": "L40S",
    "gpu_sandbox": "H100_PCIE",
    "team_a_train": "RTX_A6000",
    "team_a_embed": "A40",
    "team_b_train": "V100_SXM2",
    "team_b_serve": "L4",
}
#: The GPU model of the instance the test makes by hand with the label of a team_b_train task (no record).
LABEL_ORPHAN_GPU = "T4"


def common(dag_id: str) -> dict:
    return {
        "offer_filters": {"gpu_name": {"eq": GPUS[dag_id]}},
        "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "poll_interval": 2,
        "boot_timeout": timedelta(minutes=10),
    }


def dag(dag_id: str) -> DAG:
    return DAG(dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False, tags=["gpumarket-ui"])


with dag("nightly_finetune"):
    GpuMarketRunJobOperator(
        task_id="train", command="echo 'epoch 1/40'; sleep 100000", deferrable=False, **common("nightly_finetune")
    )

with dag("embeddings_batch"):
    GpuMarketRunJobOperator(task_id="embed", command="echo 'embedded 1000000 rows'", **common("embeddings_batch"))

with dag("eval_sweep"):
    GpuMarketRunJobOperator(task_id="evaluate", command="echo 'accuracy 0.91'; sleep 5", **common("eval_sweep"))

with dag("gpu_sandbox"):
    GpuMarketCreateInstanceOperator(task_id="rent", **common("gpu_sandbox"))

with dag("team_a_train"):
    GpuMarketRunJobOperator(
        task_id="train", command="for e in 1 2 3 4; do echo epoch $e/4; sleep 4; done", **common("team_a_train")
    )

with dag("team_a_embed"):

    @task.gpumarket(**common("team_a_embed"))
    def embed() -> int:
        import time

        time.sleep(12)  # the embedding work: long enough for the rental to cost something to compare
        return 1000

    embed()

with dag("team_b_train"):
    rented = GpuMarketCreateInstanceOperator(task_id="rent", **common("team_b_train"))
    work = BashOperator(task_id="work", bash_command="sleep 15")
    destroy = GpuMarketDestroyInstanceOperator(task_id="destroy", instance_id=rented.output)
    rented >> work >> destroy.as_teardown(setups=rented)

with dag("team_b_serve"):
    GpuMarketRunJobOperator(
        task_id="serve", command="echo serving; sleep 100000", deferrable=True, **common("team_b_serve")
    )
