"""The route to a task's history in the api-server, for Airflow 3 tasks, which may not use the metadata database.

Signed as the budget ledger's routes are (``ui/verify.py``), so only a holder of a gpumarket connection's API key may
ask. It answers what a task's latest successes tell (``task_history.learned``): its job's median running time and,
given an image, the median and largest sizes its boots imply; bad input answers 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from airflow_gpumarket import task_history
from airflow_gpumarket.ui import verify

router = APIRouter(prefix="/history")


def _asked(body: dict[str, Any]) -> tuple[str, str, str | None]:
    dag_id, task_id = task_history.check_task(body.get("dag_id"), body.get("task_id"))
    return dag_id, task_id, task_history.check_image(body.get("image"))


@router.post("/learned")
async def learned(request: Request) -> dict[str, Any]:
    dag_id, task_id, image = (await verify.accept(request, _asked)).value
    runtime, image_gb, image_gb_max = await run_in_threadpool(
        task_history.learned, verify.metadata_engine(), dag_id, task_id, image
    )
    return {"runtime_seconds": runtime, "image_gb": image_gb, "image_gb_max": image_gb_max}
