"""The DAGs that `make ui-test` (bench/ui_browser.py) runs before it opens the GPU rentals page in a browser.

Named as a data team would name them, since the page's screenshot in the README shows them. Each rents only its
own GPU model (bench/ui_browser.py writes the offers), so the DAGs never compete for a machine:

- `nightly_finetune`: a job that runs until the test marks it failed, in a worker (not deferred), so the page shows
  it as a live rental and its task's "GPU rental" link works while it runs;
- `embeddings_batch` and `eval_sweep`: short jobs that end, so the page shows their spend (per DAG, run and day);
- `gpu_sandbox`: an instance handed to its DAG run and never destroyed (no teardown on purpose), an orphan once
  the run ended, which the test destroys from the page as an admin.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_gpumarket.operators.instances import GpuMarketCreateInstanceOperator, GpuMarketRunJobOperator

#: DAG id -> the GPU model its offers have (bench/ui_browser.py reads this too).
GPUS = {
    "nightly_finetune": "A100_SXM4",
    "embeddings_batch": "RTX_4090",
    "eval_sweep": "L40S",
    "gpu_sandbox": "H100_PCIE",
}


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
