"""The signed requests a task sends to the provider's routes in the api-server: what is signed, and how it travels.

Both ends use this module: the task's client (``operators/signed_routes.py``) and the routes' check
(``ui/verify.py``). The signature is an HMAC-SHA256, keyed with the API key of the connection named, over the
method, the route, the connection, the timestamp, the nonce and the body: a request delivered to another route, or
in another connection's name, does not verify.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

#: The headers of a signed request.
TIMESTAMP = "X-GpuMarket-Timestamp"
NONCE = "X-GpuMarket-Nonce"
CONNECTION = "X-GpuMarket-Connection"
SIGNATURE = "X-GpuMarket-Signature"
#: How far a signed request's timestamp may be from the api-server's clock, either way; its nonce is remembered for
#: as long, so a captured request cannot be replayed within it.
MAX_AGE_SECONDS = 300
#: The largest body a signed route reads (its requests are a few hundred bytes); a larger one answers 413.
MAX_BODY_BYTES = 64 * 1024
#: The longest connection id (Airflow's column).
CONN_ID_CHARS = 250
#: What the signed material starts with: the scheme's name and version.
_SCHEME = "gpumarket-route-v2"

_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit also accepts other scripts' digits
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_CONNECTION = re.compile(rf"[A-Za-z0-9%._~-]{{1,{3 * 4 * CONN_ID_CHARS}}}")  # percent-encoded UTF-8
_ROUTE = re.compile(r"/[a-z/_-]{1,100}")
_METHOD = re.compile(r"[A-Z]{1,10}")


class Unsigned(ValueError):
    """A header of a signed request is missing or malformed; the message names it and says what it must be."""


@dataclass(frozen=True)
class Headers:
    """A signed request's headers, each checked for its shape (nothing is verified yet)."""

    timestamp: str
    nonce: str
    conn_id: str
    signature: str


def material(*, method: str, route: str, conn_id: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    """The bytes a request's signature covers: one line per part before the body, none of which holds a newline."""
    if not (_METHOD.fullmatch(method) and _ROUTE.fullmatch(route)):
        raise ValueError(f"method {method!r} and route {route!r} must be an upper-case verb and a lower-case path")
    if not (_TIMESTAMP.fullmatch(timestamp) and _NONCE.fullmatch(nonce)):
        raise ValueError("the timestamp must be ASCII digits and the nonce 16 to 64 URL-safe characters")
    head = "\n".join((_SCHEME, method, route, quote(conn_id, safe=""), timestamp, nonce, ""))
    return head.encode("ascii") + body


def signature(api_key: str, *, method: str, route: str, conn_id: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``material`` keyed with ``api_key``."""
    signed = material(method=method, route=route, conn_id=conn_id, timestamp=timestamp, nonce=nonce, body=body)
    return hmac.new(api_key.encode(), signed, hashlib.sha256).hexdigest()


def headers(*, conn_id: str, timestamp: str, nonce: str, signature: str) -> dict[str, str]:
    """The headers that carry a signed request's parts (the connection percent-encoded: headers are ASCII)."""
    return {TIMESTAMP: timestamp, NONCE: nonce, CONNECTION: quote(conn_id, safe=""), SIGNATURE: signature}


def read_headers(given: Mapping[str, str]) -> Headers:
    """The signed parts of a request's headers, each checked for its shape; raises Unsigned naming the first wrong."""
    timestamp, nonce = given.get(TIMESTAMP, ""), given.get(NONCE, "")
    encoded, signed = given.get(CONNECTION, ""), given.get(SIGNATURE, "")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise Unsigned(f"{TIMESTAMP} must be the request's time in epoch seconds, 1 to 12 ASCII digits")
    if not _NONCE.fullmatch(nonce):
        raise Unsigned(f"{NONCE} must be 16 to 64 letters, digits, '-' or '_', new for each request")
    if not _SIGNATURE.fullmatch(signed):
        raise Unsigned(f"{SIGNATURE} must be 64 lower-case hex digits (an HMAC-SHA256)")
    conn_id = _connection(encoded)
    if conn_id is None:
        raise Unsigned(
            f"{CONNECTION} must name the task's connection, percent-encoded UTF-8 of 1 to {CONN_ID_CHARS} characters; "
            "upgrade the provider on the workers to the api-server's version"
        )
    return Headers(timestamp, nonce, conn_id, signed)


def _connection(encoded: str) -> str | None:
    """The connection id a header carries, or None when it is not one."""
    if not _CONNECTION.fullmatch(encoded):
        return None
    try:
        conn_id = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None
    if not 0 < len(conn_id) <= CONN_ID_CHARS or not conn_id.isprintable():
        return None
    return conn_id


def matches(expected: str, given: str) -> bool:
    """Whether two hex signatures are equal, in time independent of where they differ; never raises."""
    return hmac.compare_digest(expected.encode("ascii", "replace"), given.encode("ascii", "replace"))
