"""Host memory's routes in the api-server, for Airflow 3 tasks, which may not use the metadata database.

Signed as the budget ledger's routes are (``ui/verify.py``); the account is the digest of the API key of the
connection that signed, never taken from the body. Bad input answers 400 naming the field.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from airflow_gpumarket import columns, host_memory
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ui import verify

router = APIRouter(prefix="/hosts")


def _machine(body: dict[str, Any], *, required: bool = True) -> Any:
    machine_id = body.get("machine_id")
    return None if machine_id is None and not required else host_memory.check_machine_id(machine_id)


def _failure(body: dict[str, Any]) -> dict[str, Any]:
    detail = body.get("detail", "")
    if not isinstance(detail, str):
        raise GpuMarketValidationError("detail", "must be a string")
    return {
        "machine_id": _machine(body),
        "reason": host_memory.check_reason(body.get("reason")),
        "ttl": host_memory.check_ttl(body.get("ttl_seconds", host_memory.DEFAULT_TTL_SECONDS)),
        "detail": columns.clean("detail", detail[: host_memory.DETAIL_CHARS]),
    }


def _which(body: dict[str, Any]) -> int | None:
    machine_id = _machine(body, required=False)
    if machine_id is None and body.get("all") is not True:
        raise GpuMarketValidationError("machine_id", "must be an integer, or give all: true to forget every machine")
    return machine_id


@router.post("/remember")
async def remember(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _failure)
    account = host_memory.account_of(signed.api_key)
    memory = await run_in_threadpool(
        host_memory.remember, verify.metadata_engine(), account, now=time.time(), **signed.value
    )
    return memory.to_json()


@router.post("/avoided")
async def avoided(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, verify.no_fields)
    account = host_memory.account_of(signed.api_key)
    found = await run_in_threadpool(host_memory.avoided, verify.metadata_engine(), account, now=time.time())
    return {"machines": [m.to_json() for m in found.values()]}


@router.post("/clear")
async def clear(request: Request) -> dict[str, Any]:
    signed = await verify.accept(request, _which)
    account = host_memory.account_of(signed.api_key)
    return {"cleared": await run_in_threadpool(host_memory.clear, verify.metadata_engine(), account, signed.value)}
