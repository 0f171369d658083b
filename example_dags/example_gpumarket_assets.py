"""A training DAG whose model is an Airflow asset, and the evaluation DAG that runs whenever a new model lands.

``cloud_asset`` names the model's path in the cloud integration as the OpenLineage naming conventions name the store
(``s3://models/mnist/latest`` for an S3 integration), so the asset, the lineage backend and the bucket agree. The
training task lists it in ``outlets``; when the task succeeds (its output copied out before the destroy), Airflow
records an asset event whose ``extra["gpumarket"]`` tells the rental that produced the model: instance, offer, GPU,
price and estimated cost. The evaluation DAG is scheduled on the asset and reads that extra.

On the simulator the default world's integration ``training-data`` is of type ``s3``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG, task

from airflow_gpumarket.assets import cloud_asset
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
INTEGRATION = os.environ.get("GPUMARKET_EXAMPLE_CLOUD_INTEGRATION", "training-data")
#: The integration's type, as `vastai show connections` lists it: it names the asset's scheme.
INTEGRATION_TYPE = "s3"
MODEL_PATH = "models/mnist/latest"
MODEL = cloud_asset(INTEGRATION_TYPE, MODEL_PATH)

TRAIN = """
out="$GPUMARKET_INSTANCE_ROOT/workspace/out"
mkdir -p "$out" && echo "weights after 5 epochs" > "$out/model.txt"
echo "model written"
"""

with DAG(
    dag_id="example_gpumarket_assets",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
):
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={"num_gpus": {"eq": 1}, "gpu_name": {"eq": "RTX 4090"}},
        image="pytorch/pytorch:latest",
        command=TRAIN,
        cloud_integration=INTEGRATION,
        outputs={"/workspace/out": MODEL_PATH},
        outlets=[MODEL],
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=1),
    )


with DAG(
    dag_id="example_gpumarket_assets_evaluate",
    start_date=datetime(2026, 1, 1),
    schedule=[MODEL],
    catchup=False,
    tags=["gpumarket", "example"],
):

    @task
    def evaluate(**context) -> dict:
        """Report the rental that produced the model (a real evaluation would read it from the bucket)."""
        events = context.get("triggering_asset_events") or context.get("triggering_dataset_events") or {}
        produced = [event.extra.get("gpumarket", {}) for queued in events.values() for event in queued]
        print(f"evaluating {MODEL.uri}, produced by {produced}")
        return {"model": MODEL.uri, "produced_by": produced}

    evaluate()
