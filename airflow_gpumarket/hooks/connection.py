"""An Airflow connection of type ``gpumarket`` read into settings.

Settings that would leak the key or guess a host are refused. Shared by the sync and async hooks.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError


@dataclass(frozen=True)
class ConnectionSettings:
    """What a hook needs from an Airflow connection. ``api_key`` is kept out of the repr."""

    base_url: str
    api_key: str = field(repr=False)
    timeout: float = api.REQUEST_TIMEOUT_SECONDS
    retry: api.RetryPolicy = api.RetryPolicy()
    verify: bool | str = True
    #: The server's request budgets as a multiple of the published ones; 0: no pacing (a server without limits).
    rate_limit_scale: float = 1.0


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _extra(extra: Mapping[str, Any], name: str) -> Any:
    value = extra.get(name)
    return None if value == "" else value


def _extra_number(extra: Mapping[str, Any], name: str, default: float, conn_id: str) -> float:
    value = _extra(extra, name)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not math.isfinite(number) or number < 0:
        raise GpuMarketValidationError(
            f"connection {conn_id!r} extra {name!r}", f"must be a number of at least 0, got {value!r}"
        )
    return number


def settings_from_connection(
    conn_id: str, host: str | None, port: int | None, password: str | None, extra: Mapping[str, Any]
) -> ConnectionSettings:
    """Turn a connection's fields into settings, refusing anything that would leak the key or guess a host.

    The host holds the base URL. A host without a scheme gets ``http`` when it is a loopback address (the
    simulator) and ``https`` otherwise; plaintext ``http`` to any other host is refused.
    """
    where = f"connection {conn_id!r}"
    if not host:
        raise GpuMarketValidationError(
            f"{where} host", "is empty; set it to the service's base URL, e.g. https://api.example.com"
        )
    if not password:
        raise GpuMarketValidationError(
            f"{where} password", "is empty; put the API key from the web console in the connection's password"
        )
    if "://" not in host:
        bare = urlsplit(f"//{host}").hostname or ""
        host = f"{'http' if _is_loopback(bare) else 'https'}://{host}"
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GpuMarketValidationError(
            f"{where} host", f"{host!r} is not a base URL; write it as https://HOST[:PORT][/PREFIX]"
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise GpuMarketValidationError(
            f"{where} host",
            f"{host!r} uses plaintext http to a non-loopback host, which would expose the API key; use https://",
        )
    netloc = parts.netloc
    if port and parts.port is None:
        netloc = f"{netloc}:{port}"
    base_url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    max_retries = int(_extra_number(extra, "max_retries", api.RetryPolicy.max_retries, conn_id))
    policy = api.RetryPolicy(
        max_retries=max_retries,
        min_wait=_extra_number(extra, "retry_min_wait", api.RetryPolicy.min_wait, conn_id),
        max_wait=_extra_number(extra, "retry_max_wait", api.RetryPolicy.max_wait, conn_id),
    )
    timeout = _extra_number(extra, "timeout", api.REQUEST_TIMEOUT_SECONDS, conn_id) or api.REQUEST_TIMEOUT_SECONDS
    ca_bundle = _extra(extra, "ca_bundle")
    rate_limit_scale = _extra_number(extra, "rate_limit_scale", 1.0, conn_id)
    return ConnectionSettings(base_url, password, timeout, policy, ca_bundle or True, rate_limit_scale)
