"""A training pipeline in TaskFlow: prepare -> @task.gpumarket train (on a rented GPU) -> evaluate its metrics.

``train`` runs on a rented instance with the image's ``python3``; its arguments (here an upstream task's output)
are shipped with it, and the dict it returns comes back to XCom, so ``evaluate`` reads the metrics like any other
task's output. The instance is destroyed when the function returns, and on every failure path. Runs as-is on the
embedded simulator (``make demo`` conditions) and on the real service by changing only the connection.

Keep the function self-contained (imports inside it) and its inputs and outputs small JSON: put datasets and
models in object storage and pass their paths.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG, task

# 10 s is the spec's recommended poll interval; the simulator's clock is sped up, so tests and the demo poll faster.
POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))

with DAG(
    dag_id="example_gpumarket_taskflow",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
):

    @task
    def prepare() -> dict:
        """Where the training data is and how to train on it (a real pipeline would write the data first)."""
        return {"dataset_uri": "s3://example-bucket/datasets/mnist-2026-01", "epochs": 3}

    @task.gpumarket(
        offer_filters={"gpu_name": {"in": ["RTX 4090", "RTX 3090", "A100"]}, "num_gpus": {"gte": 1}},
        max_dph=1.5,
        image="pytorch/pytorch:latest",
        max_runtime=timedelta(hours=2),
        poll_interval=POLL_SECONDS,
        log_interval=3 * POLL_SECONDS,
        multiple_outputs=True,
    )
    def train(dataset_uri: str, epochs: int) -> dict:
        import math

        loss = 1.0
        for epoch in range(1, epochs + 1):
            loss = round(loss * math.exp(-0.7), 4)
            print(f"epoch {epoch}/{epochs} loss={loss}", flush=True)
        return {"model_uri": f"{dataset_uri}/model-e{epochs}.pt", "val_loss": loss}

    @task
    def evaluate(model_uri: str, val_loss: float) -> str:
        verdict = "promote" if val_loss < 0.2 else "keep the current model"
        print(f"{model_uri}: validation loss {val_loss} -> {verdict}")
        return verdict

    data = prepare()
    metrics = train(data["dataset_uri"], data["epochs"])
    evaluate(metrics["model_uri"], metrics["val_loss"])
