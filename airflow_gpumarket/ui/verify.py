"""The check each signed route of the provider's api-server app runs first: who signed, and what they asked.

A task signs each request with its connection's API key (``signing``). In this order, so that a caller who cannot
sign costs a bounded amount of work and learns nothing: the headers' shapes and the timestamp's age (401); the body,
read up to ``signing.MAX_BODY_BYTES`` (413 beyond); the signature, checked against the key of the connection named
when it is one of the provider's, else against a key nobody holds, the same way (401, one answer for every reason);
then the body, parsed as JSON and by the route's own parser (400 naming the field); last the nonce, recorded once
(401 for a replay). Only a request that passed every step reaches the route's transaction. A signature that does not
verify is answered no sooner than ``UNSIGNED_FLOOR_SECONDS`` after the connection's lookup began, whether the
connection exists or not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from airflow_gpumarket import ledger, signing

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The one answer to a request whose signature does not verify, whatever the reason: a caller who cannot sign
#: learns nothing about which connections exist.
_UNSIGNED = (
    f"{signing.SIGNATURE} does not verify: sign with the API key of the connection named, a connection of type "
    "gpumarket defined where the api-server reads connections, and run the api-server's provider version"
)
#: What a request naming no usable connection is checked against: a key nobody holds, so that it takes the same path.
_NOBODYS_KEY = secrets.token_hex(32)
#: How much of what an unsigned caller sent may reach the api-server's log.
_LOGGED_CHARS = 64
#: The soonest a request whose signature does not verify is answered, from the start of its connection's lookup: a
#: lookup that finds the connection, or reads every backend and finds none, then takes the same time to the caller.
UNSIGNED_FLOOR_SECONDS = 0.25


@dataclass(frozen=True)
class Accepted(Generic[T]):
    """A request whose signature verified: the connection that signed, its API key, and the route's parsed body."""

    conn_id: str
    api_key: str
    value: T


def metadata_engine() -> Any:
    """The metadata database's engine, as the api-server reaches it (the provider's routes and page read it here)."""
    from airflow import settings

    return settings.engine


async def accept(request: Request, parse: Callable[[dict[str, Any]], T]) -> Accepted[T]:
    """The request, checked as this module says, with its body parsed by ``parse`` (which raises ValueError)."""
    try:
        parts = signing.read_headers(request.headers)
    except signing.Unsigned as exc:
        raise HTTPException(401, str(exc)) from None
    now = time.time()
    if abs(now - int(parts.timestamp)) > signing.MAX_AGE_SECONDS:
        off = f"{signing.TIMESTAMP} is more than {signing.MAX_AGE_SECONDS} s off the api-server's clock"
        raise HTTPException(401, f"{off}; sync the clocks")
    data = await _bounded_body(request)
    looked_up = time.monotonic()
    api_key = await run_in_threadpool(_key_of, parts.conn_id)  # a secrets backend may be slow: not on the loop
    expected = signing.signature(
        api_key or _NOBODYS_KEY,
        method=request.method,
        route=request.scope["route"].path,
        conn_id=parts.conn_id,
        timestamp=parts.timestamp,
        nonce=parts.nonce,
        body=data,
    )
    if not signing.matches(expected, parts.signature) or api_key is None:
        await _not_before(looked_up + UNSIGNED_FLOOR_SECONDS)
        raise HTTPException(401, _UNSIGNED)
    body = _json_object(data)
    if body.get("conn_id", parts.conn_id) != parts.conn_id:
        raise HTTPException(400, f"conn_id: must be the connection that signed, as {signing.CONNECTION} names it")
    try:
        value = parse(body)
    except ValueError as exc:
        raise HTTPException(400, _printable(str(exc))) from None
    first = await run_in_threadpool(
        ledger.first_use, metadata_engine(), parts.nonce, stamp=int(parts.timestamp), now=now
    )
    if not first:
        raise HTTPException(401, "this signed request was received before; each request is accepted once")
    return Accepted(parts.conn_id, api_key, value)


def no_fields(body: dict[str, Any]) -> None:
    """The parser of a route that reads no field but the connection (which ``accept`` checks)."""
    return None


async def _not_before(moment: float) -> None:
    """Wait, without blocking the api-server, until ``moment`` on the monotonic clock."""
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def _bounded_body(request: Request) -> bytes:
    """The request's body; 413 as soon as it is over ``signing.MAX_BODY_BYTES``, before any of it is parsed."""
    too_large = HTTPException(
        413, f"the body is over {signing.MAX_BODY_BYTES} bytes; a signed route's request is a few hundred"
    )
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 12 or int(declared) > signing.MAX_BODY_BYTES):
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > signing.MAX_BODY_BYTES:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise HTTPException(400, "body: the client left before sending it whole") from None
    return b"".join(chunks)


def _key_of(conn_id: str) -> str | None:
    """The API key of the provider's connection ``conn_id``, or None (the reason goes to the api-server's log only)."""
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    shown = conn_id[:_LOGGED_CHARS]
    try:
        conn = GpuMarketHook.get_connection(conn_id)
    except Exception as exc:  # noqa: BLE001 - a connection the api-server cannot read, for any reason
        _unreadable.warn(f"names connection {shown!r}, which the api-server cannot read ({type(exc).__name__})")
        return None
    if conn.conn_type != GpuMarketHook.conn_type:
        kind = str(conn.conn_type)[:_LOGGED_CHARS]
        _unreadable.warn(f"names connection {shown!r}, of type {kind!r}: only gpumarket connections sign")
        return None
    return conn.password or None


class _FewLines:
    """A warning written at most once a minute, with the number of its kind left out since the last one written."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last = -math.inf
        self._left_out = 0

    def warn(self, what: str) -> None:
        with self._lock:
            now = self._clock()
            if now - self._last < 60.0:
                self._left_out += 1
                return
            self._last, left_out, self._left_out = now, self._left_out, 0
        more = f" ({left_out} more such requests in the last minute)" if left_out else ""
        log.warning("A signed request %s%s", what, more)


_unreadable = _FewLines()


def _json_object(data: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 when it is none, or when a field holds NaN or Infinity (Python writes them)."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting too deep for the parser
        body = None
    if not isinstance(body, dict):
        raise HTTPException(400, "body: must be a JSON object")
    for name, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise HTTPException(
                400, _printable(f"{name[:_LOGGED_CHARS]}: must be a finite number; JSON has no {value}")
            )
    return body


def _printable(detail: str) -> str:
    """``detail`` as JSON can carry it: a lone surrogate from the body is written as its escape."""
    return detail.encode("utf-8", "backslashreplace").decode("utf-8")
