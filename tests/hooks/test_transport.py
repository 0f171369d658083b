"""How bytes move (``hooks/transport.py``): the requests session of the sync hook and the httpx client of the async
one (timeouts, TLS, redirects, idle connections), and transport failures."""

from __future__ import annotations

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
