from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG, task

with DAG(dag_id="example_gpumarket_quickstart", start_date=datetime(2026, 1, 1), schedule=None):

    @task.gpumarket(
        offer_filters={"gpu_name": {"in": ["RTX 4090", "RTX 3090"]}},
        max_dph=1.5,  # $/h, never more
        image="pytorch/pytorch:latest",
        max_runtime=timedelta(hours=1),
    )
    def train(epochs: int) -> dict:
        loss = 1.0  # runs on the rented GPU: keep imports inside the function
        for _ in range(epochs):
            loss *= 0.5
        return {"epochs": epochs, "loss": loss}

    train(epochs=3)
