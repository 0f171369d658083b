"""Rental records as the page's rules read them, for the ui tests."""

from __future__ import annotations

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui import records
from airflow_gpumarket.ui.spend import RecordRow

NOW = 1_800_000_000.0
KEY = lifecycle.rental_key("train_dag", "run-1", "train", -1)  # row()'s task instance's
LABEL = lifecycle.make_label(KEY, NOW + 600)


def row(instance_id=1, *, created_at=NOW - 3600, cost=None, handed_over=False, run_id="run-1", dag_id="train_dag"):
    """The record of one rental of the train_dag's train task."""
    record = records.started(
        instance_id=instance_id,
        conn_id="gpumarket_default",
        offer_id=7,
        gpu_name="RTX 4090",
        hourly_price=0.5,
        bid=None,
        created_at=created_at,
        try_number=1,
        handed_over=handed_over,
    )
    if cost is not None:
        record = {**record, "ended_at": created_at + 60, "cost": cost}
    return RecordRow(dag_id, run_id, "train", -1, record)
