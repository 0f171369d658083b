"""The budget ledger's routes in the api-server, for Airflow 3 tasks, which may not use the metadata database.

A task signs each request with its connection's API key over a timestamp, a nonce and the body
(``budgets.signature``); the route reads that connection where the api-server sees it, checks the signature, and
records the nonce, so only a holder of the key that rents can reserve or settle, and a captured request is refused
when sent again. The budgets come from the Variable as the api-server reads it, never from the body. Each route runs
one ``ledger`` transaction; a refusal answers 409 with the sentence the task fails with.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from airflow_gpumarket import budgets, ledger

router = APIRouter(prefix="/ledger")
log = logging.getLogger(__name__)

#: The one answer to a request whose signature does not verify, whatever the reason: a caller who cannot sign
#: learns nothing about which connections exist.
_UNSIGNED = (
    "X-GpuMarket-Signature does not verify: sign with the API key of the connection named, and define that "
    "connection where the api-server reads connections"
)
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")


def metadata_engine() -> Any:
    """The metadata database's engine, as the api-server reaches it (the provider's routes and page read it here)."""
    from airflow import settings

    return settings.engine


async def _signed_body(request: Request) -> dict[str, Any]:
    """The request's JSON body once its signature is checked and its nonce is new; 400 or 401 naming what is wrong."""
    return (await signed_body_and_key(request))[0]


async def signed_body_and_key(request: Request) -> tuple[dict[str, Any], str]:
    """The request's JSON body and the API key that signed it (its connection's), checked as ``_signed_body`` does."""
    data = await request.body()
    try:
        body = json.loads(data)
    except ValueError:
        raise HTTPException(400, "body must be JSON") from None
    conn_id = body.get("conn_id") if isinstance(body, dict) else None
    if not isinstance(conn_id, str) or not conn_id:
        raise HTTPException(400, "conn_id must name the task's connection")
    stamp = request.headers.get("X-GpuMarket-Timestamp", "")
    nonce = request.headers.get("X-GpuMarket-Nonce", "")
    given = request.headers.get("X-GpuMarket-Signature", "")
    now = time.time()
    if not stamp.isdigit() or abs(now - int(stamp)) > budgets.SIGNATURE_MAX_AGE_SECONDS:
        raise HTTPException(
            401,
            f"X-GpuMarket-Timestamp is missing or more than {budgets.SIGNATURE_MAX_AGE_SECONDS} s off the "
            "api-server's clock; sync the clocks",
        )
    if not _NONCE.fullmatch(nonce):
        raise HTTPException(401, "X-GpuMarket-Nonce must be 16 to 64 letters, digits, '-' or '_', new for each request")
    from airflow_gpumarket.exceptions import GpuMarketError
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    try:
        api_key = GpuMarketHook(conn_id).settings.api_key
    except Exception as exc:  # noqa: BLE001 - a connection the api-server cannot read, for any reason
        # The reason goes to the api-server's log only: the caller gets the answer of a bad signature.
        reason = str(exc) if isinstance(exc, GpuMarketError) else type(exc).__name__
        log.warning("A ledger request names connection %r, which the api-server cannot read (%s)", conn_id, reason)
        api_key = None
    if api_key is None or not hmac.compare_digest(budgets.signature(api_key, stamp, nonce, data), given):
        raise HTTPException(401, _UNSIGNED)
    if not ledger.first_use(metadata_engine(), nonce, stamp=int(stamp), now=now):
        raise HTTPException(401, "this signed request was received before; each request is accepted once")
    return body, api_key


def _int_or_none(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise HTTPException(400, f"{name} must be an integer")
    return value


@router.post("/reserve")
async def reserve(request: Request) -> dict[str, Any]:
    body = await _signed_body(request)
    try:
        asked = ledger.Request.from_json(body)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    try:
        return ledger.reserve(metadata_engine(), asked, now=time.time()).to_json()
    except ledger.BudgetRefused as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/attempts")
async def attempts(request: Request) -> dict[str, Any]:
    body = await _signed_body(request)
    asked: dict[str, Any] = {}
    for name in ("dag_id", "run_id", "task_id"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise HTTPException(400, f"{name} must be a non-empty string")
        asked[name] = body[name]
    for name in ("map_index", "try_number"):
        if (value := _int_or_none(body, name)) is None:
            raise HTTPException(400, f"{name} must be an integer")
        asked[name] = value
    return {"last": ledger.last_attempt(metadata_engine(), conn_id=body["conn_id"], **asked)}


@router.post("/attach")
async def attach(request: Request) -> dict[str, Any]:
    body = await _signed_body(request)
    reservation_id, instance_id = _int_or_none(body, "id"), _int_or_none(body, "instance_id")
    if reservation_id is None or instance_id is None:
        raise HTTPException(400, "id and instance_id must be integers")
    ledger.attach(metadata_engine(), body["conn_id"], reservation_id, instance_id)
    return {}


@router.post("/settle")
async def settle(request: Request) -> dict[str, Any]:
    body = await _signed_body(request)
    reservation_id, instance_id = _int_or_none(body, "id"), _int_or_none(body, "instance_id")
    if reservation_id is None and instance_id is None:
        raise HTTPException(400, "id (the reservation) or instance_id must be given")
    ended, cost = body.get("ended"), body.get("cost")
    if ended is not None and (isinstance(ended, bool) or not isinstance(ended, int | float)):
        raise HTTPException(400, "ended must be the service's epoch seconds, or null")
    if cost is not None and not (isinstance(cost, int | float) and not isinstance(cost, bool) and 0 <= cost < math.inf):
        raise HTTPException(400, "cost must be the rental's cost in dollars (0 or more), or null")
    settled = ledger.settle(
        metadata_engine(),
        body["conn_id"],
        now=time.time(),
        reservation_id=reservation_id,
        instance_id=instance_id,
        ended=ended,
        cost=cost,
    )
    return {"cost": settled}


@router.post("/version")
async def version(request: Request) -> dict[str, Any]:
    """The provider's and Airflow's versions in this api-server (``airflow gpumarket doctor`` compares them)."""
    await _signed_body(request)
    from airflow import __version__ as airflow_version

    from airflow_gpumarket import __version__

    return {"provider": __version__, "airflow": airflow_version}


@router.post("/entries")
async def entries(request: Request) -> dict[str, Any]:
    body = await _signed_body(request)
    since = body.get("since")
    if isinstance(since, bool) or not isinstance(since, int | float):
        raise HTTPException(400, "since must be a number of epoch seconds")
    return {"entries": ledger.entries(metadata_engine(), since=float(since), conn_id=body["conn_id"])}
