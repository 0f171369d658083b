"""The budget ledger's routes in the api-server, for Airflow 3 tasks, which may not use the metadata database.

Each request is signed with the API key of the connection it names and checked by ``ui/verify.py`` before its body
is read; each route's parser below names every field it reads and its bounds (400 otherwise). The budgets come from
the Variable as the api-server reads it, never from the body. Each route runs one ``ledger`` transaction, in a thread
(a lock wait must not hold the api-server's event loop); a refusal answers 409 with the sentence the task fails
with.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from airflow_gpumarket import columns, ledger
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ui import verify

router = APIRouter(prefix="/ledger")


def _task_try(body: dict[str, Any]) -> dict[str, Any]:
    """The task try a request names (the connection is the one that signed)."""
    return {
        "dag_id": columns.text(body, "dag_id"),
        "run_id": columns.text(body, "run_id"),
        "task_id": columns.text(body, "task_id"),
        "map_index": columns.integer(body, "map_index", low=-1, high=columns.INT32),
        "try_number": columns.integer(body, "try_number", low=0, high=columns.INT32),
    }


def _reservation(body: dict[str, Any], *, required: bool = True) -> Any:
    return columns.integer(body, "id", low=1, high=columns.INT32, required=required)


def _instance(body: dict[str, Any], *, required: bool = True) -> Any:
    return columns.integer(body, "instance_id", low=0, high=columns.INT64, required=required)


def _attachment(body: dict[str, Any]) -> tuple[int, int]:
    return _reservation(body), _instance(body)


def _settlement(body: dict[str, Any]) -> dict[str, Any]:
    asked = {
        "reservation_id": _reservation(body, required=False),
        "instance_id": _instance(body, required=False),
        "ended": columns.number(body, "ended", high=columns.MAX_EPOCH, required=False),
        "cost": columns.number(body, "cost", required=False),
    }
    if asked["reservation_id"] is None and asked["instance_id"] is None:
        raise GpuMarketValidationError("id", "must name the reservation, or instance_id its instance")
    return asked


def _since(body: dict[str, Any]) -> float:
    return float(columns.number(body, "since", low=-columns.MAX_EPOCH, high=columns.MAX_EPOCH))


@router.post("/reserve")
async def reserve(request: Request) -> dict[str, Any]:
    asked = (await verify.accept(request, ledger.Request.from_json)).value
    try:
        made = await run_in_threadpool(ledger.reserve, verify.metadata_engine(), asked, now=time.time())
    except ledger.BudgetRefused as exc:
        raise HTTPException(409, str(exc)) from None
    return made.to_json()


@router.post("/attempts")
async def attempts(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _task_try)
    last = await run_in_threadpool(
        ledger.last_attempt, verify.metadata_engine(), conn_id=signed.conn_id, **signed.value
    )
    return {"last": last}


@router.post("/attach")
async def attach(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _attachment)
    try:
        await run_in_threadpool(ledger.attach, verify.metadata_engine(), signed.conn_id, *signed.value)
    except ledger.Unknown as exc:
        raise HTTPException(404, str(exc)) from None
    except ledger.Settled as exc:
        raise HTTPException(409, str(exc)) from None
    return {}


@router.post("/settle")
async def settle(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _settlement)
    engine = verify.metadata_engine()
    cost = await run_in_threadpool(ledger.settle, engine, signed.conn_id, now=time.time(), **signed.value)
    return {"cost": cost}


@router.post("/version")
async def version(request: Request) -> dict[str, Any]:
    """The provider's and Airflow's versions in this api-server (``airflow gpumarket doctor`` compares them)."""
    await verify.accept(request, verify.no_fields)
    from airflow import __version__ as airflow_version

    from airflow_gpumarket import __version__

    return {"provider": __version__, "airflow": airflow_version}


@router.post("/entries")
async def entries(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _since)
    found = await run_in_threadpool(
        ledger.entries, verify.metadata_engine(), since=signed.value, conn_id=signed.conn_id
    )
    return {"entries": found}
