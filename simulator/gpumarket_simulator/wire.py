"""The ASGI layer in front of the routes: what happens on the wire before and after the service's logic.

It names the operation of each API request, reads the bearer key, applies the fault rules (latency, dropped
connections, injected statuses, rate limits), keeps the request log, and keeps the admin surface for loopback
clients. Dropping a connection needs the server's transport, which only the outermost ASGI callable can
reach: that is why faults live here and not in the routes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from typing import Any

from gpumarket_simulator.logs import UPLOAD_PREFIX
from gpumarket_simulator.market import LOGGED_BODIES, Market
from gpumarket_simulator.paths import (
    PATH_API_KEYS,
    PATH_CHANGE_BID,
    PATH_CHARGES,
    PATH_CLOUD_INTEGRATIONS,
    PATH_COPY_DIRECT,
    PATH_CREATE_INSTANCE,
    PATH_CURRENT_USER,
    PATH_DEPLOYMENTS,
    PATH_ENDPOINTS,
    PATH_GPU_NAMES,
    PATH_INSTANCE,
    PATH_INSTANCE_FILTERS,
    PATH_INSTANCES,
    PATH_INSTANCES_V1,
    PATH_INVOICES,
    PATH_PENDING_PRICE_INCREASES,
    PATH_RCLONE,
    PATH_REGEN_BACKUP_CODES,
    PATH_REQUEST_LOGS,
    PATH_SEARCH_OFFERS,
    PATH_VOLUMES,
)
from gpumarket_simulator.ratelimits import TOO_FREQUENT

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ADMIN_PREFIX = "/_sim"
#: Scope key under which the routes find ``(key kind, instance id or None, raw key or None)``.
AUTH_SCOPE_KEY = "gpumarket.auth"

_EXACT_OPERATIONS = {
    ("POST", PATH_SEARCH_OFFERS): "search_offers",
    ("GET", PATH_INSTANCES): "list_instances",
    ("POST", PATH_VOLUMES): "create_volume_listings",
    ("POST", PATH_ENDPOINTS): "create_endpoint",
    ("PUT", PATH_REGEN_BACKUP_CODES): "regenerate_backup_codes",
    ("DELETE", PATH_DEPLOYMENTS): "delete_deployments",
    ("GET", PATH_PENDING_PRICE_INCREASES): "list_pending_price_increases",
    ("GET", PATH_API_KEYS): "list_api_keys",
    ("GET", PATH_CLOUD_INTEGRATIONS): "list_cloud_integrations",
    ("GET", PATH_INSTANCES_V1): "list_instances_v1",
    ("GET", PATH_CURRENT_USER): "current_user",
    ("GET", PATH_CHARGES): "list_charges",
    ("GET", PATH_INVOICES): "list_invoices",
    ("GET", PATH_GPU_NAMES): "gpu_names",
    ("GET", PATH_INSTANCE_FILTERS): "instance_filters",
    ("PUT", PATH_COPY_DIRECT): "copy_direct",
    ("DELETE", PATH_COPY_DIRECT): "cancel_copy_direct",
    ("POST", PATH_RCLONE): "cloud_copy",
    ("DELETE", PATH_RCLONE): "cancel_cloud_copy",
}
#: Every exact API path, for the live profile's tolerance of a missing or extra trailing slash.
_EXACT_PATHS = frozenset(path for _, path in _EXACT_OPERATIONS) | {PATH_INSTANCES}


def _path_pattern(template: str, name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(re.escape("{" + name + "}"), "[^/]+") + "$")


_ASK_PATH = _path_pattern(PATH_CREATE_INSTANCE, "offer_id")
_INSTANCE_PATH = _path_pattern(PATH_INSTANCE, "instance_id")
_INSTANCE_OPERATIONS = {"GET": "get_instance", "PUT": "stop_instance", "DELETE": "destroy_instance"}
_LOGS_PATH = _path_pattern(PATH_REQUEST_LOGS, "instance_id")
_BID_PATH = _path_pattern(PATH_CHANGE_BID, "instance_id")
#: The operation name of a fetch of an uploaded log (it needs no key and has no rate limit or faults).
FETCH_LOG_UPLOAD = "fetch_log_upload"


def classify(method: str, path: str) -> str | None:
    """The operation name of an API request (the names fault rules use), or None for other paths."""
    op = _EXACT_OPERATIONS.get((method, path))
    if op is not None:
        return op
    if method in _INSTANCE_OPERATIONS and _INSTANCE_PATH.match(path):
        return _INSTANCE_OPERATIONS[method]
    if method in ("PUT", "POST") and _ASK_PATH.match(path):
        return "create_instance"
    if method == "PUT" and _LOGS_PATH.match(path):
        return "request_instance_logs"
    if method == "PUT" and _BID_PATH.match(path):
        return "change_bid"
    return None


def tolerant_path(path: str) -> str:
    """Live profile: the route a path means when its trailing slash is missing or extra.

    The official CLI adds one to several paths the spec writes without, and the live service answers both.
    """
    if path in _EXACT_PATHS or not path.startswith("/api/"):
        return path
    for candidate in (path + "/", path.rstrip("/")):
        if candidate in _EXACT_PATHS:
            return candidate
    templated = (_INSTANCE_PATH, _ASK_PATH, _LOGS_PATH, _BID_PATH)
    if not path.endswith("/") and any(p.match(path + "/") for p in templated):
        return path + "/"
    return path


def logged_body(chunks: list[bytes]) -> Any:
    """A request body for the log: the JSON value, else the text; None when nothing was read."""
    raw = b"".join(chunks)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw.decode("utf-8", "replace")


def bearer_key(scope: Scope) -> str | None:
    """The key of a well-formed ``Authorization: Bearer <key>`` header, else None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").strip().partition(" ")
            key = key.strip()
            if scheme.lower() == "bearer" and key and " " not in key:
                return key
            return None
    return None


def is_loopback(client: Any) -> bool:
    if not client:
        return False
    host = client[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def send_json(send: Send, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


async def send_text(send: Send, status: int, text: str) -> None:
    """A plain-text answer, as the live service's rate limiter gives."""
    payload = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def drop_connection(send: Send) -> None:
    """Close the TCP connection at once, without a response, as a crashed proxy or a network cut would."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise RuntimeError("this server does not expose its transport; cannot drop the connection")
    transport.abort()
    # Let the server notice the lost connection, so it does not complain that no response was started.
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class WireLayer:
    def __init__(self, app: ASGIApp, market: Market) -> None:
        self.app = app
        self.market = market

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_send, send = send, self._dated(send)  # dropping a connection needs the server's own send
        path: str = scope["path"]
        if path.startswith(UPLOAD_PREFIX):
            await self._serve_log_upload(scope, send)
            return
        if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
            if not is_loopback(scope.get("client")):
                await send_json(send, 403, {"error": "forbidden", "msg": "the /_sim/ admin surface is loopback-only"})
                return
            await self.app(scope, receive, send)
            return

        market = self.market
        method: str = scope["method"]
        live = market.profile == "live"
        if live:
            scope["path"] = tolerant_path(path)  # routing sees the canonical path; the log keeps what came
        op = classify(method, scope["path"])
        key = bearer_key(scope)
        kind, instance_id = market.principal(key)
        scope[AUTH_SCOPE_KEY] = (kind, instance_id, key)
        status: list[int | None] = [None]

        if live and op is not None and kind in ("account", "instance"):
            client = (scope.get("client") or ("?", 0))[0]
            if not market.rate_limits.take(op, method, key or "", client, market.clock.now()):
                market.log_request(method, path, 429, kind, op)
                await send_text(send, 429, TOO_FREQUENT)
                return

        decision = market.faults.decide(op, key or "") if op is not None and market.faults.active else None
        if decision is not None:
            if decision.delay:
                await asyncio.sleep(decision.delay)
            if decision.drop_before:
                market.log_request(method, path, None, kind, op, dropped=True)
                await drop_connection(raw_send)
                return
            if decision.status is not None:
                market.log_request(method, path, decision.status, kind, op)
                if decision.text:
                    await send_text(send, decision.status, decision.msg)
                    return
                body = {"error": decision.error, "msg": decision.msg}
                await send_json(send, decision.status, body, decision.headers)
                return
            if decision.drop_after:

                async def swallow(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        status[0] = message["status"]

                await self.app(scope, receive, swallow)
                market.log_request(method, path, status[0], kind, op, dropped=True)
                await drop_connection(raw_send)
                return

        # The request log keeps the bodies of some operations (creates: a test checks no credential is sent).
        chunks: list[bytes] = []

        async def keep_body(message: Message) -> Message:
            if op in LOGGED_BODIES and message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        async def app_receive() -> Message:
            return await keep_body(await receive())

        # The request is logged before its answer leaves: a client that reads the log right after its answer
        # arrived must find the request there (a slow machine showed the race).
        async def record_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                market.log_request(method, path, status[0], kind, op, body=logged_body(chunks))
            await send(message)

        await self.app(scope, app_receive, record_status)
        if status[0] is None:
            market.log_request(method, path, None, kind, op, body=logged_body(chunks))

    def _dated(self, send: Send) -> Send:
        """Put the service's time, the simulated clock, in every answer's Date header, as HTTP servers do.

        The simulated clock runs ahead of the client's at any speed but 1x. A client that measures the service's
        timestamps (an instance's ``start_date``) against the service's own time gets the simulated durations.
        """
        clock = self.market.clock

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                date = (b"date", formatdate(clock.now(), usegmt=True).encode())
                message = {**message, "headers": [*message.get("headers", []), date]}
            await send(message)

        return dated

    async def _serve_log_upload(self, scope: Scope, send: Send) -> None:
        """Serve an uploaded log as object storage does: no key needed, 404 until the upload has landed.

        The request log records which key (if any) came along, so tests can prove none did.
        """
        market = self.market
        kind, _ = market.principal(bearer_key(scope))
        method, path = scope["method"], scope["path"]
        text = market.log_uploads.get(path[len(UPLOAD_PREFIX) :], market.clock.now()) if method == "GET" else None
        if text is None:
            status = 404 if method == "GET" else 405
            market.log_request(method, path, status, kind, FETCH_LOG_UPLOAD)
            await send_text(send, status, "NoSuchKey: the object does not exist (yet)" if status == 404 else "")
            return
        market.log_request(method, path, 200, kind, FETCH_LOG_UPLOAD)
        await send_text(send, 200, text)
