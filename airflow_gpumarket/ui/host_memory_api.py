"""Host memory's routes in the api-server, for Airflow 3 tasks, which may not use the metadata database.

Signed as the budget ledger's routes are (``ui/ledger_api.py``); the account is the digest of the API key of the
connection named, read where the api-server sees it, never taken from the body. Bad input answers 400 naming the
field.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from airflow_gpumarket import host_memory
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ui import ledger_api
from airflow_gpumarket.ui.ledger_api import signed_body_and_key

router = APIRouter(prefix="/hosts")


@router.post("/remember")
async def remember(request: Request) -> dict[str, Any]:
    body, api_key = await signed_body_and_key(request)
    detail = body.get("detail", "")
    if not isinstance(detail, str):
        raise HTTPException(400, "detail must be a string")
    try:
        memory = host_memory.remember(
            ledger_api.metadata_engine(),
            host_memory.account_of(api_key),
            host_memory.check_machine_id(body.get("machine_id")),
            host_memory.check_reason(body.get("reason")),
            now=time.time(),
            ttl=body.get("ttl_seconds", host_memory.DEFAULT_TTL_SECONDS),
            detail=detail,
        )
    except GpuMarketValidationError as exc:
        raise HTTPException(400, str(exc)) from None
    return memory.to_json()


@router.post("/avoided")
async def avoided(request: Request) -> dict[str, Any]:
    _, api_key = await signed_body_and_key(request)
    found = host_memory.avoided(ledger_api.metadata_engine(), host_memory.account_of(api_key), now=time.time())
    return {"machines": [m.to_json() for m in found.values()]}


@router.post("/clear")
async def clear(request: Request) -> dict[str, Any]:
    body, api_key = await signed_body_and_key(request)
    if body.get("machine_id") is None and body.get("all") is not True:
        raise HTTPException(400, "machine_id must be an integer, or give all: true to forget every machine")
    try:
        cleared = host_memory.clear(
            ledger_api.metadata_engine(), host_memory.account_of(api_key), body.get("machine_id")
        )
    except GpuMarketValidationError as exc:
        raise HTTPException(400, str(exc)) from None
    return {"cleared": cleared}
