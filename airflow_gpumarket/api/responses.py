"""Reading answers: bodies, headers, and the mapping of error shapes to the provider's exceptions.

Headers read are Retry-After and the rate-limit ones; error shapes are the spec's and the live service's.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpumarket.types import Instance

from airflow_gpumarket.api.paths import BODY_EXCERPT_CHARS
from airflow_gpumarket.api.retry import MAX_RETRY_AFTER_SECONDS
from airflow_gpumarket.api.validation import is_positive_int
from airflow_gpumarket.exceptions import (
    GpuMarketAuthError,
    GpuMarketCopyRefusedError,
    GpuMarketCreateRefusedError,
    GpuMarketError,
    GpuMarketNotFoundError,
    GpuMarketOfferUnavailableError,
    GpuMarketQuotaExceededError,
    GpuMarketRateLimitError,
    GpuMarketServerError,
)


def decode_body(content: bytes | str | None) -> Any:
    """JSON body, or the raw text when the body is not JSON (some proxies answer HTML)."""
    if not content:
        return None
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    try:
        return json.loads(text)
    except ValueError:
        return text


def redact(text: str, secrets: Iterable[str | None]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta-seconds form; an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


#: An ``X-RateLimit-Reset`` above this is an epoch time, below it a number of seconds.
_EPOCH_THRESHOLD = 1_000_000_000


def parse_rate_limit_reset(value: str | None, now: float) -> float | None:
    """``X-RateLimit-Reset`` as seconds from ``now``: servers send either epoch seconds or a delta."""
    seconds = parse_retry_after(value)
    if seconds is None:
        return None
    return max(0.0, seconds - now) if seconds > _EPOCH_THRESHOLD else seconds


#: ``error`` values of a quota that no short wait will restore.
QUOTA_ERRORS = ("search_quota_exceeded",)
#: ``error`` values and ``msg`` phrases that mean a bad key whatever the status (the live service has been seen
#: answering a revoked key with 404 ``auth_error``: read as "not found", a destroy would report "already gone").
AUTH_ERRORS = ("auth_error", "invalid_api_key", "unauthorized")
_AUTH_PHRASES = ("invalid user key", "invalid api key")
_TEXT_EXCERPT_CHARS = 200


def is_auth_error(error: str | None, msg: str | None) -> bool:
    words = (msg or "").lower()
    return (error or "").lower() in AUTH_ERRORS or any(p in words for p in _AUTH_PHRASES)


#: Operations whose ``success: false`` is a refusal to start a copy (``GpuMarketCopyRefusedError``).
COPY_START_OPERATIONS = ("start_instance_copy", "start_cloud_copy")
_UNAVAILABLE_WORDS = ("unavail", "not available", "no longer", "rented", "taken", "no_such_ask")


def raise_for_response(
    operation: str,
    status_code: int,
    body: Any,
    *,
    retry_after: str | None = None,
    rate_limit_reset: str | None = None,
    now: float | None = None,
    secrets: Iterable[str | None] = (),
) -> Any:
    """Return the decoded body of a successful response, or raise the exception a person can act on.

    The server's ``error`` and ``msg`` are kept on the exception and quoted in its message, with any secret
    (``secrets``: the API key) replaced by ``***``. ``retry_after`` and ``rate_limit_reset`` are the raw
    ``Retry-After`` and ``X-RateLimit-Reset`` headers; ``now`` (epoch seconds) reads the latter when it is a time.
    """
    secrets = tuple(secrets)
    error = body.get("error") if isinstance(body, dict) else None
    msg = body.get("msg") if isinstance(body, dict) else None
    error = redact(str(error), secrets) if error is not None else None
    msg = redact(str(msg), secrets) if msg is not None else None
    words = ": ".join(p for p in (error, msg) if p)
    if not words and isinstance(body, str) and body.strip():
        words = redact(body.strip()[:_TEXT_EXCERPT_CHARS], secrets)
    said = f" Server said: {words}" if words else ""
    kwargs: dict[str, Any] = {"status_code": status_code, "error": error, "msg": msg, "operation": operation}
    if 200 <= status_code < 300:
        if isinstance(body, dict) and body.get("success") is False:
            if is_auth_error(error, msg):
                raise GpuMarketAuthError(_auth_sentence(operation, status_code, said), **kwargs)
            contract = body.get("new_contract")
            if operation == "create_instance" and is_positive_int(contract):
                raise GpuMarketCreateRefusedError(
                    f"create_instance failed: the service answered success=false, yet made instance {contract} "
                    f"(stopped; a bid below the machine's minimum does this).{said}",
                    new_contract=contract,
                    **kwargs,
                )
            if operation in COPY_START_OPERATIONS:
                raise GpuMarketCopyRefusedError(
                    f"{operation} was refused: the service answered success=false and copies nothing.{said} Check "
                    "that the instances and the integration exist and are yours, and the paths.",
                    **kwargs,
                )
            raise GpuMarketError(f"{operation} failed: the service answered success=false.{said}", **kwargs)
        return body
    if status_code in (401, 403) or is_auth_error(error, msg):
        raise GpuMarketAuthError(_auth_sentence(operation, status_code, said), **kwargs)
    if status_code == 429:
        _raise_rate_limited(operation, said, kwargs, retry_after, rate_limit_reset, now)
    if operation == "create_instance" and _offer_unavailable(status_code, error, msg):
        raise GpuMarketOfferUnavailableError(
            f"create_instance: the offer is no longer available (HTTP {status_code}); it was probably rented by "
            f"someone else after the search. Search again and pick another offer.{said}",
            **kwargs,
        )
    if status_code == 404:
        if not isinstance(body, dict):
            # The service answers its own 404s with an error object; anything else came from a proxy or a wrong
            # base URL, and must not be read as "the instance is gone" (a destroy would then report success).
            raise GpuMarketError(
                f"{operation}: HTTP 404 without the service's error object; the connection's host (base URL) may "
                f"point at the wrong server or path.{said}",
                **kwargs,
            )
        raise GpuMarketNotFoundError(f"{operation}: not found (HTTP 404).{said}", **kwargs)
    if status_code >= 500:
        raise GpuMarketServerError(
            f"{operation}: the service failed (HTTP {status_code}); retrying may help.{said}", **kwargs
        )
    raise GpuMarketError(f"{operation} was rejected (HTTP {status_code}).{said}", **kwargs)


def _auth_sentence(operation: str, status_code: int, said: str) -> str:
    return (
        f"{operation} was refused (HTTP {status_code}): the API key is missing, wrong, revoked or not allowed "
        f"to do this. Check the password of the gpumarket connection.{said}"
    )


def _raise_rate_limited(
    operation: str,
    said: str,
    kwargs: dict[str, Any],
    retry_after: str | None,
    rate_limit_reset: str | None,
    now: float | None,
) -> None:
    seconds = parse_retry_after(retry_after)
    if seconds is None:
        seconds = parse_rate_limit_reset(rate_limit_reset, time.time() if now is None else now)
    if kwargs["error"] in QUOTA_ERRORS or (seconds is not None and seconds > MAX_RETRY_AFTER_SECONDS):
        when = f" in about {_hours_and_minutes(seconds)}" if seconds is not None else ""
        raise GpuMarketQuotaExceededError(
            f"{operation}: a quota of the account is used up (HTTP 429) and resets{when or ' later'}. Failing now "
            f"instead of sleeping that long: run the task again after the reset, or make fewer calls of this "
            f"kind.{said}",
            retry_after=seconds,
            **kwargs,
        )
    hint = f" The server asked to wait {seconds:g} s." if seconds is not None else ""
    message = f"{operation} was rate limited (HTTP 429).{hint}{said}"
    raise GpuMarketRateLimitError(message, retry_after=seconds, **kwargs)


def _hours_and_minutes(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _offer_unavailable(status_code: int, error: Any, msg: Any) -> bool:
    if status_code in (404, 409, 410):
        return True
    words = f"{error or ''} {msg or ''}".lower()
    return 400 <= status_code < 500 and any(w in words for w in _UNAVAILABLE_WORDS)


def expect_list(operation: str, body: Any, key: str | None) -> list[Any]:
    """The list a listing endpoint answers (under ``key``, or the body itself when ``key`` is None).

    A 200 whose body has no such list is an error, not an empty list: after an ambiguous create, reading an empty
    list would wrongly prove that no instance exists and lead to renting twice.
    """
    value = body.get(key) if isinstance(body, dict) and key is not None else body
    if key is not None and isinstance(body, dict) and key not in body:
        value = None
    if isinstance(value, list):
        return value
    where = f"a list under {key!r}" if key else "a list"
    raise GpuMarketError(
        f"{operation}: the service answered HTTP 200 without {where}; it may be misconfigured or a proxy answered "
        f"instead. Got: {str(body)[:BODY_EXCERPT_CHARS]!r}",
        status_code=200,
        operation=operation,
    )


def unwrap_instance(body: Any, instance_id: int | None = None) -> Instance:
    """``GET /instances/{id}/`` answers ``{"instances": {...}}``; return the inner object.

    ``{"instances": null}`` is how the live service answers for an instance that no longer exists (or is not
    the caller's): not found. A body without ``instances`` at all is an error, not "gone".
    """
    if not isinstance(body, dict) or "instances" not in body:
        raise GpuMarketError(
            f"get_instance: the service answered HTTP 200 without an 'instances' object; it may be misconfigured "
            f"or a proxy answered instead. Got: {str(body)[:_TEXT_EXCERPT_CHARS]!r}",
            status_code=200,
            operation="get_instance",
        )
    inner = body["instances"]
    if isinstance(inner, list):  # tolerate a one-element list
        inner = inner[0] if inner else None
    if not isinstance(inner, dict):
        which = f"instance {instance_id}" if instance_id is not None else "the instance"
        raise GpuMarketNotFoundError(
            f"get_instance: {which} does not exist (the service returned no instance object)",
            status_code=200,
            operation="get_instance",
        )
    return inner  # type: ignore[return-value]
