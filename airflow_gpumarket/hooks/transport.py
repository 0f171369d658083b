"""How bytes move, for the hooks' drivers: requests (``GpuMarketHook``) and httpx (``GpuMarketAsyncHook``).

``send``/``asend`` make one exchange and answer the ``Response``, or the ``GpuMarketTransportError`` that the
driver throws into the flow; ``fetch_log``/``afetch_log`` read an uploaded log without the API key. Nothing here
decides anything: that is ``hooks.core``'s; the messages are ``hooks.flow``'s.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import requests
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketTransportError
from airflow_gpumarket.hooks.connection import ConnectionSettings
from airflow_gpumarket.hooks.flow import FetchedLog, Request, Response

if TYPE_CHECKING:
    import ssl

    import httpx

#: Seconds an idle pooled connection of the async client is kept. Below the idle timeout of the servers and load
#: balancers in front of them (5 s for uvicorn's default, 60 s and more for common balancers): a connection the
#: server closed while the client reused it shows up as ``RemoteProtocolError`` in trigger logs.
CLIENT_KEEPALIVE_SECONDS = 4.0
#: The connect timeout, at most: a server that does not accept a connection within this is down.
CONNECT_TIMEOUT_SECONDS = 10.0


class LogBuffer:
    """The end of an uploaded log as it is read: at most ``LOG_MAX_BYTES``, starting at a whole line."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.cut = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > api.paths.LOG_MAX_BYTES:
            del self.data[: len(self.data) - api.paths.LOG_MAX_BYTES]
            self.cut = True

    def text(self) -> str:
        data = self.data[self.data.find(b"\n") + 1 :] if self.cut else self.data
        return data.decode("utf-8", "replace")


class _BearerAuth(requests.auth.AuthBase):
    """Bearer auth as an ``auth`` object, so a ~/.netrc entry can never replace it. Its repr hides the key."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._api_key}"
        return request

    def __repr__(self) -> str:
        return "_BearerAuth(***)"


def requests_session(settings: ConnectionSettings) -> requests.Session:
    session = requests.Session()
    session.auth = _BearerAuth(settings.api_key)
    session.verify = settings.verify
    session.headers["Accept"] = "application/json"
    return session


def send(
    session: requests.Session, settings: ConnectionSettings, request: Request
) -> Response | GpuMarketTransportError:
    try:
        response = session.request(
            request.method,
            settings.base_url + request.path,
            json=request.body,
            params=request.params,
            timeout=(min(CONNECT_TIMEOUT_SECONDS, settings.timeout), settings.timeout),
            # A redirect is not part of the contract (and would turn a PUT into a GET): surface it instead.
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        return transport_error(request, exc, settings.base_url)
    return Response(response.status_code, response.content, response.headers)


def fetch_log(session: requests.Session, url: str) -> FetchedLog:
    try:
        with session.get(url, timeout=api.LOG_FETCH_TIMEOUT_SECONDS, stream=True) as response:
            if response.status_code != 200:
                return FetchedLog(failure=f"HTTP {response.status_code}")
            buffer = LogBuffer()
            for chunk in response.iter_content(65536):
                buffer.add(chunk)
            return FetchedLog(buffer.text())
    except requests.RequestException as exc:
        return FetchedLog(failure=type(exc).__name__)


@functools.cache
def ssl_context(verify: bool | str, trust_env: bool) -> ssl.SSLContext:
    """The TLS context for ``verify`` (and ``SSL_CERT_FILE`` with ``trust_env``), built once per process.

    Building one loads the CA bundle (tens of milliseconds): done for each client, it blocked the triggerer's loop.
    """
    import httpx

    return httpx.create_ssl_context(verify=verify, trust_env=trust_env)


def httpx_client(settings: ConnectionSettings) -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(
        base_url=settings.base_url,
        headers={"Authorization": f"Bearer {settings.api_key}", "Accept": "application/json"},
        timeout=httpx.Timeout(settings.timeout, connect=min(CONNECT_TIMEOUT_SECONDS, settings.timeout)),
        limits=httpx.Limits(keepalive_expiry=CLIENT_KEEPALIVE_SECONDS),
        verify=ssl_context(settings.verify, trust_env=False),
        trust_env=False,
    )


async def asend(client: httpx.AsyncClient, request: Request) -> Response | GpuMarketTransportError:
    import httpx

    try:
        response = await client.request(request.method, request.path, json=request.body, params=request.params)
    except httpx.HTTPError as exc:
        return transport_error(request, exc, str(client.base_url))
    return Response(response.status_code, response.content, response.headers)


async def afetch_log(url: str) -> FetchedLog:
    import httpx

    try:
        async with (
            httpx.AsyncClient(
                timeout=api.LOG_FETCH_TIMEOUT_SECONDS, follow_redirects=True, verify=ssl_context(True, trust_env=True)
            ) as storage,
            storage.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                return FetchedLog(failure=f"HTTP {response.status_code}")
            buffer = LogBuffer()
            async for chunk in response.aiter_bytes():
                buffer.add(chunk)
            return FetchedLog(buffer.text())
    except httpx.HTTPError as exc:
        return FetchedLog(failure=type(exc).__name__)


def transport_error(request: Request, exc: BaseException, base_url: str) -> GpuMarketTransportError:
    """Wrap a requests/httpx failure; ``request_sent`` is False only when no connection was ever made."""
    never_connected = _never_connected(exc)
    detail = f"{request.operation}: {request.method} {request.path} got no response from {_server(base_url)} "
    detail += f"({type(exc).__name__}); "
    advice = "Check the host of the Airflow connection and {} (`airflow gpumarket doctor` checks both)."
    if _name_unresolved(exc):
        detail += f"the host name {urlsplit(base_url).hostname} did not resolve."
        advice = advice.format("this machine's DNS")
    elif never_connected:
        detail += "the connection could not be opened."
        advice = advice.format("that this machine reaches it")
    else:
        detail += "the request may have reached the server."
        advice = ""
    return GpuMarketTransportError(
        f"{detail} {advice}".rstrip(), request_sent=not never_connected, operation=request.operation, detail=detail
    )


def _server(base_url: str) -> str:
    """The base URL as an error may show it: scheme, host, port and path, never a user or password."""
    parts = urlsplit(base_url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and those it wraps: urllib3's ``reason``, an argument that is one, its cause or context."""
    seen: BaseException | None = exc
    walked: set[int] = set()
    while seen is not None and id(seen) not in walked:  # a chain may loop back on itself
        walked.add(id(seen))
        yield seen
        reason = getattr(seen, "reason", None)
        if isinstance(reason, BaseException) and reason is not seen:
            seen = reason
            continue
        args = getattr(seen, "args", ())
        nested = args[0] if args and isinstance(args[0], BaseException) else None
        seen = nested or seen.__cause__ or seen.__context__


def _never_connected(exc: BaseException) -> bool:
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if any(isinstance(seen, NewConnectionError | ConnectTimeoutError | ConnectionRefusedError) for seen in _chain(exc)):
        return True
    type_name = type(exc).__name__
    return type_name in ("ConnectError", "ConnectTimeout")  # httpx names


def _name_unresolved(exc: BaseException) -> bool:
    """True when the host name did not resolve: a ``socket.gaierror`` under requests' and httpx's errors alike."""
    return any(isinstance(seen, socket.gaierror) for seen in _chain(exc))
