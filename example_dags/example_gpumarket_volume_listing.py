"""Host: list disk volumes on several of your machines (hidden from public search while you test)."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.volumes import GpuMarketCreateVolumeListingOperator

with DAG(
    dag_id="example_gpumarket_volume_listing",
    start_date=datetime(2026, 1, 1),
    schedule=None,
    catchup=False,
    params={"machines": [9001, 9002]},  # the simulator host's machines; pass yours when triggering
    render_template_as_native_obj=True,
    tags=["gpumarket", "example", "host"],
) as dag:
    GpuMarketCreateVolumeListingOperator(
        task_id="list_volumes",
        machines="{{ params.machines }}",
        hidden_listing=True,
    )
