"""The task's client of the provider's signed routes in the api-server (the ledger, host memory, the task history).

Each request is signed as ``signing`` says, with the API key of the task's connection, over its method, route,
connection, time, a new nonce and its body. A body holding a number that is not finite is refused here, before
anything is sent: JSON has no NaN or Infinity, and the routes refuse them too.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

from airflow_gpumarket import signing
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketValidationError

#: Where the api-server mounts the provider's app (``ui/plugin.py``); each route's path is under it.
APP_PATH = "/gpumarket"
#: Seconds a request to the api-server may take.
TIMEOUT_SECONDS = 30.0
#: Sends of one request whose answer did not come: each route is idempotent, so a lost answer is asked again.
TRIES = 3


def api_server_url() -> str:
    """The api-server's base URL as a task process reaches it (``[gpumarket] ledger_url`` first)."""
    from airflow.configuration import conf

    base = conf.get("gpumarket", "ledger_url", fallback="") or ""
    if not base:
        execution = conf.get("core", "execution_api_server_url", fallback="") or ""
        base = execution.rstrip("/").removesuffix("/execution") if execution else ""
        base = base or conf.get("api", "base_url", fallback="") or "http://localhost:8080"
    return base


def signed_post(
    app_url: str,
    route: str,
    api_key: str,
    body: dict[str, Any],
    *,
    name: str,
    conflict: Callable[[str], Exception] | None = None,
) -> Any:
    """The JSON answer of the route ``route`` (e.g. ``/ledger/reserve``) of the app at ``app_url`` to ``body``.

    ``body["conn_id"]`` names the connection whose key ``api_key`` is. Sent again (a new nonce, the same body) when no
    answer came. ``name`` names the routes in messages. A 400 raises GpuMarketValidationError naming the field, a 409
    ``conflict(detail)`` when given, any other refusal, or no answer, an AirflowException.
    """
    import requests

    failure = ""
    for _ in range(TRIES):
        data, headers = signed_request(api_key, route, body)
        try:
            reply = requests.post(app_url + route, data=data, headers=headers, timeout=TIMEOUT_SECONDS)
        except requests.RequestException as exc:
            failure = type(exc).__name__
            continue
        if reply.status_code == 400:
            raise GpuMarketValidationError(*_field_and_problem(reply_detail(reply)))
        if reply.status_code == 409 and conflict is not None:
            raise conflict(reply_detail(reply))
        if reply.status_code >= 400:
            raise AirflowException(f"{name} refused the request: {reply_detail(reply)}")
        try:
            return reply.json()
        except ValueError:
            raise AirflowException(f"{name} answered with no JSON: {reply_detail(reply)}") from None
    raise AirflowException(
        f"{name} did not answer ({failure}). Install the provider on the api-server, and set [gpumarket] ledger_url "
        "when the api-server is not the execution API's host."
    )


def signed_request(api_key: str, route: str, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A POST to ``route``: its bytes and headers, signed with ``api_key`` as ``signing`` says (a new nonce each)."""
    for field, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise GpuMarketValidationError(field, f"must be a finite number, got {value!r}; nothing was sent")
    data = json.dumps(body, sort_keys=True, allow_nan=False).encode()
    stamp, nonce, conn_id = str(int(time.time())), secrets.token_hex(16), str(body.get("conn_id", ""))
    parts = {"conn_id": conn_id, "timestamp": stamp, "nonce": nonce}
    mac = signing.signature(api_key, method="POST", route=route, body=data, **parts)
    return data, {"Content-Type": "application/json", **signing.headers(signature=mac, **parts)}


def _field_and_problem(detail: str) -> tuple[str, str]:
    """A route's 400 sentence split into the field it names first and the problem ("worst: must be a number")."""
    head, colon, rest = detail.partition(": ")
    if colon and head.isidentifier():
        return head, rest
    field, _, problem = detail.partition(" ")
    return field, problem or "is invalid"


def reply_detail(reply: Any) -> str:
    """What an api-server route said of a refused request: its ``detail``, else the start of its body."""
    try:
        detail = reply.json().get("detail")
    except ValueError:
        detail = None
    return str(detail or reply.text[:300] or reply.status_code)
