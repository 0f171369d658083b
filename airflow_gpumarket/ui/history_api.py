"""The route to a task's history in the api-server, for Airflow 3 tasks, which may not use the metadata database.

Signed as the budget ledger's routes are (``ui/ledger_api.py``), so only a holder of a connection's API key may ask.
It answers what a task's latest successes tell (``task_history.learned``): its job's median running time and, given
an image, the median and largest sizes its boots imply; bad input answers 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from airflow_gpumarket import task_history
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ui import ledger_api
from airflow_gpumarket.ui.ledger_api import signed_body_and_key

router = APIRouter(prefix="/history")


@router.post("/learned")
async def learned(request: Request) -> dict[str, Any]:
    body, _ = await signed_body_and_key(request)
    try:
        dag_id, task_id = task_history.check_task(body.get("dag_id"), body.get("task_id"))
        image = task_history.check_image(body.get("image"))
    except GpuMarketValidationError as exc:
        raise HTTPException(400, str(exc)) from None
    runtime, image_gb, image_gb_max = task_history.learned(ledger_api.metadata_engine(), dag_id, task_id, image)
    return {"runtime_seconds": runtime, "image_gb": image_gb, "image_gb_max": image_gb_max}
