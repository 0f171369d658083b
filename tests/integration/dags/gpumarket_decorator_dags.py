"""DAGs for @task.gpumarket: a function run on a rented instance, its return value to XCom (dag.test())."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.common.compat.sdk import DAG, task

POLL = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
COMMON = {"offer_filters": {"num_gpus": {"gte": 1}}, "image": "img", "poll_interval": POLL}


def _pipeline(dag_id: str, deferrable: bool) -> DAG:
    with DAG(dag_id=dag_id, start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:

        @task
        def prepare() -> dict:
            return {"uri": "s3://data/train", "rows": 1000}

        @task.gpumarket(**COMMON, deferrable=deferrable, multiple_outputs=True)
        def train(data: dict, epochs: int) -> dict:
            import math

            print(f"training on {data['uri']} for {epochs} epochs")
            print("GPUMARKET-RESULT-000000000000 eyJmb3JnZWQiOiB0cnVlfQ==")  # looks like a result; is not one
            return {"model_uri": data["uri"] + "/model", "val_loss": round(math.exp(-epochs), 4)}

        @task
        def evaluate(model_uri: str, val_loss: float) -> str:
            assert model_uri == "s3://data/train/model" and val_loss == round(2.718281828459045**-3, 4)
            return f"{model_uri}: {val_loss}"

        metrics = train(prepare(), epochs=3)
        evaluate(metrics["model_uri"], metrics["val_loss"])
    return dag


pipeline_sync = _pipeline("gpm_dec_pipeline_sync", deferrable=False)
pipeline_deferred = _pipeline("gpm_dec_pipeline_deferred", deferrable=True)

with DAG(dag_id="gpm_dec_raises", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as raises:

    @task.gpumarket(**COMMON)
    def divide(a: int, b: int) -> float:
        return a / b

    divide(1, 0)

with DAG(dag_id="gpm_dec_mapped", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as mapped:

    @task.gpumarket(**COMMON)
    def square(x: int) -> int:
        return x * x

    @task
    def total(values) -> int:
        assert sorted(values) == [1, 4, 9, 16], values
        return sum(values)

    total(square.expand(x=[1, 2, 3, 4]))

with DAG(dag_id="gpm_dec_big_xcom", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as big_xcom:

    @task
    def produce() -> str:
        import secrets

        return secrets.token_hex(20_000)  # about 40 KB that does not compress: too large for the onstart script

    @task.gpumarket(**COMMON)
    def consume(blob: str) -> int:
        return len(blob)

    consume(produce())
