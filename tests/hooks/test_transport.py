"""How bytes move (``hooks/transport.py``): the requests session of the sync hook and the httpx client of the async
one (timeouts, TLS, redirects, idle connections), and transport failures."""

from __future__ import annotations

import socket

import httpx
import pytest
import requests
from hook_fakes import API_KEY, AUTH_HEADER, BASE_URL, run, url

from airflow_gpumarket.exceptions import (
    GpuMarketError,
    GpuMarketTransportError,
)

INSTANCES = url("/api/v1/instances/")


# --- requests, for the sync hook -------------------------------------------------------------------------------
def test_redirects_are_not_followed(requests_mock, hook):
    requests_mock.put(url("/api/v0/instances/5/"), status_code=302, headers={"Location": url("/elsewhere")})
    with pytest.raises(GpuMarketError, match="HTTP 302"):
        hook.stop_instance(5)
    assert requests_mock.call_count == 1


def test_retries_exhausted_by_transport_errors_raise_a_transport_error(requests_mock, hook):
    requests_mock.get(INSTANCES, exc=requests.exceptions.ConnectionError)

    with pytest.raises(GpuMarketTransportError, match=r"list_instances: GET /api/v1/instances/ got no response"):
        hook.list_instances()

    assert requests_mock.call_count == 4


def test_a_service_never_reached_is_named_by_its_address_and_the_fix_without_credentials():
    from airflow_gpumarket.hooks.flow import Request
    from airflow_gpumarket.hooks.transport import transport_error

    refused = requests.exceptions.ConnectionError(ConnectionRefusedError(111, "Connection refused"))
    error = transport_error(
        Request("search_offers", "POST", "/api/v0/bundles/"), refused, "https://u:s3cret@gpu.example:8443/"
    )
    assert str(error).startswith("search_offers: POST /api/v0/bundles/ got no response from https://gpu.example:8443 ")
    assert "the connection could not be opened" in str(error) and "airflow gpumarket doctor" in str(error)
    assert "s3cret" not in str(error) and "u:" not in str(error)


def _unresolved_name_errors() -> list[BaseException]:
    """A host name that did not resolve, as requests (through urllib3) and httpx (through httpcore) raise it."""
    from urllib3.exceptions import MaxRetryError, NameResolutionError

    gaierror = socket.gaierror(-2, "Name or service not known")
    resolution = NameResolutionError("gpu.example", None, gaierror)  # type: ignore[arg-type]
    resolution.__cause__ = gaierror
    requests_error = requests.exceptions.ConnectionError(MaxRetryError(None, "/", reason=resolution))  # type: ignore[arg-type]
    httpx_error = httpx.ConnectError("[Errno -2] Name or service not known")
    httpx_error.__cause__ = gaierror
    return [requests_error, httpx_error]


@pytest.mark.parametrize("exc", _unresolved_name_errors(), ids=["requests", "httpx"])
def test_a_host_name_that_does_not_resolve_is_named_as_such(exc):
    from airflow_gpumarket.hooks.flow import Request
    from airflow_gpumarket.hooks.transport import transport_error

    error = transport_error(Request("search_offers", "POST", "/api/v0/bundles/"), exc, "https://gpu.example:8443/")
    assert "the host name gpu.example did not resolve." in str(error) and "this machine's DNS" in str(error)
    assert "could not be opened" not in str(error) and not error.request_sent
    assert "airflow gpumarket doctor" in str(error) and "doctor" not in error.detail


@pytest.mark.parametrize(
    ("call", "timeout"),
    [
        (lambda h: h.list_instances(), (10.0, 30.0)),
        (lambda h: h.destroy_instance(1), (10.0, 30.0)),
    ],
    ids=["read", "destroy"],
)
def test_every_request_carries_a_timeout(requests_mock, hook, call, timeout):
    requests_mock.register_uri("GET", url("/api/v1/instances/"), json={"instances": []})
    requests_mock.register_uri("DELETE", url("/api/v0/instances/1/"), json={"success": True})

    call(hook)

    assert requests_mock.last_request.timeout == timeout


def test_one_session_per_hook_with_tls_verification_on(requests_mock, hook):
    requests_mock.get(url("/api/v1/instances/"), json={"instances": []})

    hook.list_instances()
    hook.list_instances()

    assert hook.session is hook.session  # a cached session, not a new one per call
    assert hook.session.verify is True
    # requests may swap True for the CA bundle named by REQUESTS_CA_BUNDLE; verification stays on either way.
    assert all(r.verify not in (False, None) for r in requests_mock.request_history)


# --- httpx, for the async hook ---------------------------------------------------------------------------------
def test_async_client_configuration(server):
    async def check(hook):
        client = hook.client
        assert str(client.base_url).rstrip("/") == BASE_URL
        assert client.headers["Authorization"] == AUTH_HEADER
        assert client.timeout.read == 30.0
        assert client.timeout.connect == 10.0
        assert API_KEY not in repr(hook.settings)

    run(check)


def test_async_client_keeps_idle_connections_shorter_than_servers_do(monkeypatch):
    from airflow_gpumarket.hooks import gpumarket

    captured = {}

    def client(**kwargs):
        captured.update(kwargs)
        return object()

    hook = gpumarket.GpuMarketAsyncHook()
    from airflow_gpumarket.hooks.connection import settings_from_connection

    hook.__dict__["settings"] = settings_from_connection("c", "https://api.example.com", None, "k", {})
    monkeypatch.setattr(httpx, "AsyncClient", client)
    hook.client  # noqa: B018 - building the client is what is tested

    # uvicorn's default idle timeout is 5 s and load balancers use 60 s: a pooled connection must expire first
    assert captured["limits"].keepalive_expiry < 5


# --- nothing of the async hook blocks the triggerer's event loop ----------------------------------------------------
def test_rule_async_clients_share_one_tls_context_built_once_per_process(server, monkeypatch):
    """Building a TLS context loads the CA bundle (tens of ms on the loop): one per process, not one per client."""
    from airflow_gpumarket.hooks import transport

    transport.ssl_context.cache_clear()
    built = []
    real = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", lambda **kw: built.append(kw) or real(**kw))

    async def many_clients(hook):
        for _ in range(5):
            hook.client  # noqa: B018 - a new client each time, as a trigger's step makes
            await hook.aclose()

    run(many_clients)
    assert built == [{"verify": True, "trust_env": False}]


def test_rule_the_async_hook_books_its_request_slots_off_the_event_loop(server, monkeypatch):
    """Booking a slot locks a file that other processes share: the async driver does it in a thread."""
    import threading

    from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

    server.add("GET", "/api/v0/instances/7/", httpx.Response(200, json={"instances": {"id": 7}}))
    booked_on = []
    monkeypatch.setattr(GpuMarketAsyncHook, "paces", lambda self, operation: True)
    monkeypatch.setattr(
        GpuMarketAsyncHook, "_pace", lambda self, operation: booked_on.append(threading.get_ident()) or 0.0
    )

    async def read(hook):
        return threading.get_ident(), await hook.get_instance(7)

    loop_thread, _ = run(read)
    assert booked_on and loop_thread not in booked_on


def test_an_exception_chain_that_loops_back_on_itself_is_walked_once():
    from airflow_gpumarket.hooks.transport import _chain

    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert list(_chain(first)) == [first, second]
