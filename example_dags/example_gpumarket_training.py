"""Training pipeline in explicit steps: search -> create (setup) -> wait for the job -> destroy (teardown).

Runs as-is on the embedded simulator (`make demo`) and on the real service by changing only the
`gpumarket_default` connection. The training command runs on the instance through the provider's onstart
wrapper, which destroys the instance itself when the command exits 0 (and stops it otherwise); the teardown task
destroys whatever is left, whatever happened upstream.

While the job runs, the sensor forwards its new output lines to its task log every ``log_interval``. Should the
command fail (say ``sys.exit("CUDA out of memory")``), the sensor's log ends like this::

    [instance 12000001] epoch 1/3 loss=0.5000
    [instance 12000001] CUDA out of memory
    [instance 12000001] gpumarket: job exited with status 1
    AirflowFailException: the job on instance 12000001 failed: the instance is in status 'stopped' (...); the
    command ended with exit status 1; its last output lines, quoted from its log:
        > epoch 1/3 loss=0.5000
        > CUDA out of memory
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.search import GpuMarketSearchOffersOperator
from airflow_gpumarket.operators.teardown import GpuMarketDestroyInstanceOperator
from airflow_gpumarket.sensors.instances import GpuMarketInstanceStatusSensor

# 10 s is the spec's recommended poll interval; the demo polls faster because the simulator's clock is sped up.
POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
GPU_FILTERS = {"gpu_name": {"in": ["RTX 4090", "RTX 3090"]}, "num_gpus": {"gte": 1}, "reliability": {"gte": 0.95}}

TRAIN = """
echo "training on $(hostname) with EPOCHS=$EPOCHS"
python3 - <<'PY'
import os, time
epochs = int(os.environ.get("EPOCHS", "3"))
loss = 1.0
for epoch in range(1, epochs + 1):
    loss *= 0.5
    print(f"epoch {epoch}/{epochs} loss={loss:.4f}", flush=True)
    time.sleep(0.2)
print("model saved")
PY
"""

with DAG(
    dag_id="example_gpumarket_training",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
    default_args={"gpumarket_conn_id": "gpumarket_default"},
) as dag:
    search = GpuMarketSearchOffersOperator(
        task_id="search_offers",
        offer_filters=GPU_FILTERS,
        offer_order=[["dph_total", "asc"]],
        limit=5,
        max_dph=1.0,
    )
    create = GpuMarketCreateInstanceOperator(
        task_id="create_instance",
        offer_filters=GPU_FILTERS,
        max_dph=1.0,
        image="pytorch/pytorch:latest",
        disk=16,
        env={"EPOCHS": "3"},
        command=TRAIN,
        poll_interval=POLL_SECONDS,
        boot_timeout=timedelta(minutes=10),
        lease=timedelta(hours=2),
    )
    train = GpuMarketInstanceStatusSensor(
        task_id="wait_for_training",
        instance_id=create.output,
        wait_for_job=True,
        poke_interval=POLL_SECONDS,
        log_interval=3 * POLL_SECONDS,  # the job's output reaches this log every 30 s (the default); 0 turns it off
        timeout=timedelta(hours=1).total_seconds(),
    )
    destroy = GpuMarketDestroyInstanceOperator(task_id="destroy_instance", instance_id=create.output)

    search >> create >> train >> destroy.as_teardown(setups=create)
