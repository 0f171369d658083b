"""Training on staged data: inputs copied in from cloud storage, outputs copied out, checkpoints kept in the cloud.

The service copies between the instance and a cloud integration set up once in its console (Account -> Cloud
connections; ``vastai show connections`` lists the names). Its keys stay with the service: neither the create
request nor the instance holds a storage credential. Before the job starts, ``datasets/mnist`` is copied to
``/workspace/data`` and the last checkpoint saved at ``checkpoint_uri`` (none on the first run) to
``checkpoint_dir``. After the job, ``checkpoint_dir`` is saved back to ``checkpoint_uri`` (so a retry, or the next
run, resumes), and after exit 0 ``/workspace/out`` is copied to a folder of its own per DAG run.

On the simulator the default world has the integration ``training-data`` (id 1), whose bucket begins with a tiny
``datasets/mnist``; other data goes there with ``curl -X PUT --data-binary @train.csv
http://127.0.0.1:<port>/_sim/buckets/1/files/datasets/mnist/train.csv``. An input that does not exist fails the task
before the job starts.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

POLL_SECONDS = float(os.environ.get("GPUMARKET_POLL_INTERVAL", "10"))
#: The cloud integration's name (or id) as the console shows it.
INTEGRATION = os.environ.get("GPUMARKET_EXAMPLE_CLOUD_INTEGRATION", "training-data")
#: Five steps over the data, a checkpoint after each (written to step.tmp, then renamed), then the model.
TRAIN = """
# GPUMARKET_INSTANCE_ROOT is empty on the real service; the simulator sets it to the instance's disk directory.
data="$GPUMARKET_INSTANCE_ROOT/workspace/data"
out="$GPUMARKET_INSTANCE_ROOT/workspace/out"
ck="$GPUMARKET_CHECKPOINT_DIR"
mkdir -p "$out"
step=$(cat "$ck/step" 2>/dev/null || echo 0)
echo "training on $(ls "$data" | wc -l) input files; resumes at step $step (from: ${GPUMARKET_RESUMED_FROM:-nothing})"
while [ "$step" -lt 5 ]; do
  sleep 1 || exit 143
  step=$((step+1))
  echo "$step" > "$ck/step.tmp" && mv "$ck/step.tmp" "$ck/step"
  echo "step $step done"
done
cat "$data"/* | wc -c > "$out/bytes_seen.txt"
echo "model after $step steps" > "$out/model.txt"
"""

with DAG(
    dag_id="example_gpumarket_staged_data",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    tags=["gpumarket", "example"],
) as dag:
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters={
            "num_gpus": {"eq": 1},
            "gpu_name": {"eq": "RTX 4090"},
            # Bandwidth is billed per GB at the offer's prices (the spec does not list these fields; the service does).
            "inet_down_cost": {"lte": 0.02},
            "inet_up_cost": {"lte": 0.02},
        },
        image="pytorch/pytorch:latest",
        command=TRAIN,
        cloud_integration=INTEGRATION,
        inputs={"/workspace/data": "datasets/mnist"},
        outputs={"/workspace/out": "runs/{{ run_id | replace(':', '_') }}/out"},
        checkpoint_dir="/workspace/checkpoints",
        checkpoint_uri="checkpoints/{{ dag.dag_id }}",
        on_restore_failure="restart",  # a checkpoint that does not arrive: start from scratch (or "fail")
        staging_timeout=timedelta(minutes=30),  # the bound of each copy step
        retries=2,  # a retry resumes from checkpoint_uri
        poll_interval=POLL_SECONDS,
        max_runtime=timedelta(hours=2),
        deferrable=True,
    )
