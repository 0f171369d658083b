"""GpuMarketAsyncHook (httpx, used by triggers): same wire format, results and retry rules as the sync hook.

The hook builds its own ``httpx.AsyncClient`` (base URL, bearer header, timeouts); the tests only slip an
``httpx.MockTransport`` under it, so what is checked is what the hook really configures.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from hook_fakes import API_KEY, AUTH_HEADER, BASE_URL, url

from airflow_gpumarket.exceptions import GpuMarketAuthError, GpuMarketNotFoundError, GpuMarketServerError
from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook


@pytest.fixture
def server(monkeypatch):
    """Answers the async hook's requests from a queue of (method, path) -> list of httpx.Response, recording
    every request."""

    class Server:
        def __init__(self) -> None:
            self.routes: dict[tuple[str, str], list] = {}
            self.requests: list[httpx.Request] = []

        def add(self, method: str, path: str, *responses: httpx.Response | Exception) -> None:
            self.routes.setdefault((method, path), []).extend(responses)

        def handler(self, request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            queue = self.routes.get((request.method, request.url.path))
            assert queue, f"unexpected request {request.method} {request.url}"
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(answer, Exception):
                raise answer
            return answer

    srv = Server()
    real_client = httpx.AsyncClient

    def client_with_mock_transport(*args, **kwargs):
        return real_client(*args, transport=httpx.MockTransport(srv.handler), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", client_with_mock_transport)
    return srv


@pytest.fixture
def async_sleeps(monkeypatch) -> list[float]:
    """The waits the async hook asks for (recorded, never slept); a recorded wait moves the budget pacer's clock."""
    import time

    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float, *args, **kwargs) -> None:
        # Only the test's own loop (main thread) is recorded; another thread's loop, such as a simulator server
        # left running by an earlier test, keeps real time instead of spinning.
        if threading.current_thread() is not threading.main_thread():
            return await real_sleep(seconds, *args, **kwargs)
        recorded.append(seconds)

    class PacerClock:
        def __getattr__(self, name: str):
            return getattr(time, name)

        @staticmethod
        def time() -> float:
            return time.time() + sum(recorded)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    monkeypatch.setattr("airflow_gpumarket.pacing.time", PacerClock())
    return recorded


def run(coro_fn):
    """Run ``coro_fn(hook)`` on a fresh async hook, closing its client afterwards."""

    async def main():
        hook = GpuMarketAsyncHook()
        await hook.asettings()
        try:
            return await coro_fn(hook)
        finally:
            await hook.aclose()

    return asyncio.run(main())


INSTANCE = {"id": 7001, "actual_status": "loading", "label": "job"}


def test_async_get_instance_path_headers_and_unwrap(server):
    server.add("GET", "/api/v0/instances/7001/", httpx.Response(200, json={"instances": INSTANCE}))

    assert run(lambda h: h.get_instance(7001)) == INSTANCE

    (request,) = server.requests
    assert (request.method, str(request.url)) == ("GET", url("/api/v0/instances/7001/"))
    assert request.headers["Authorization"] == AUTH_HEADER
    assert request.headers["Accept"] == "application/json"
    assert request.content == b""


def test_async_client_configuration(server):
    async def check(hook):
        client = hook.client
        assert str(client.base_url).rstrip("/") == BASE_URL
        assert client.headers["Authorization"] == AUTH_HEADER
        assert client.timeout.read == 30.0
        assert client.timeout.connect == 10.0
        assert API_KEY not in repr(hook.settings)

    run(check)


def test_async_429_with_retry_after_then_200_is_retried_after_that_wait(server, async_sleeps):
    server.add(
        "GET",
        "/api/v0/instances/7001/",
        httpx.Response(429, headers={"Retry-After": "4"}, json={"msg": "slow down"}),
        httpx.Response(200, json={"instances": INSTANCE}),
    )

    assert run(lambda h: h.get_instance(7001)) == INSTANCE

    assert len(server.requests) == 2
    assert async_sleeps == [4.0]


def test_async_503_then_200_is_retried(server, async_sleeps):
    server.add(
        "GET",
        "/api/v1/instances/",
        httpx.Response(503),
        httpx.Response(200, json={"instances_found": 1, "instances": [INSTANCE]}),
    )

    assert run(lambda h: h.list_instances()) == [INSTANCE]
    assert len(server.requests) == 2


def test_async_connect_error_then_200_is_retried(server, async_sleeps):
    server.add(
        "GET",
        "/api/v1/instances/",
        httpx.ConnectError("refused"),
        httpx.Response(200, json={"instances": []}),
    )

    assert run(lambda h: h.list_instances()) == []
    assert len(server.requests) == 2


def test_async_retries_exhausted_raise_the_last_error(server, async_sleeps):
    server.add("GET", "/api/v1/instances/", httpx.Response(502, json={"msg": "gateway"}))

    with pytest.raises(GpuMarketServerError, match="gateway"):
        run(lambda h: h.list_instances())

    assert len(server.requests) == 4


def test_async_destroy_deletes_without_body(server):
    server.add("DELETE", "/api/v0/instances/7001/", httpx.Response(200, json={"success": True}))

    assert run(lambda h: h.destroy_instance(7001)) == {"success": True}
    (request,) = server.requests
    assert (request.method, str(request.url), request.content) == ("DELETE", url("/api/v0/instances/7001/"), b"")


def test_async_destroy_404_is_success(server):
    server.add("DELETE", "/api/v0/instances/7001/", httpx.Response(404, json={"error": "not_found"}))

    assert run(lambda h: h.destroy_instance(7001)) == {"success": True, "already_gone": True}
    assert len(server.requests) == 1


def test_async_get_instance_404_raises_not_found(server):
    server.add("GET", "/api/v0/instances/9/", httpx.Response(404, json={"msg": "No instance 9"}))

    with pytest.raises(GpuMarketNotFoundError, match="No instance 9"):
        run(lambda h: h.get_instance(9))


def test_async_401_raises_auth_error_without_the_key(server):
    server.add("GET", "/api/v1/instances/", httpx.Response(401, json={"msg": f"bad {API_KEY}"}))

    with pytest.raises(GpuMarketAuthError) as caught:
        run(lambda h: h.list_instances())

    assert API_KEY not in str(caught.value)
    assert "bad ***" in str(caught.value)
    assert len(server.requests) == 1


def test_async_list_pending_price_increases_returns_whole_response(server):
    body = {"success": True, "count": 0, "pending_price_increases": [], "truncated": False}
    server.add("GET", "/api/v0/instances/pending-price-increases", httpx.Response(200, json=body))

    assert run(lambda h: h.list_pending_price_increases()) == body
    assert str(server.requests[0].url) == url("/api/v0/instances/pending-price-increases")


def test_async_hook_masks_the_key_when_reading_the_connection(masked):
    async def main():
        hook = GpuMarketAsyncHook()
        assert masked == []
        settings = await hook.asettings()
        assert settings.base_url == BASE_URL
        assert masked == [API_KEY]

    asyncio.run(main())


def test_async_json_body_is_not_sent_for_reads(server):
    server.add("GET", "/api/v1/instances/", httpx.Response(200, content=json.dumps({"instances": []}).encode()))

    run(lambda h: h.list_instances())

    assert "content-type" not in server.requests[0].headers


def test_async_logs_are_requested_with_the_key_and_fetched_without_it(server, async_sleeps):
    storage = "https://storage.example.net/logs/tok-77"
    server.add(
        "PUT",
        "/api/v0/instances/request_logs/7001/",
        httpx.Response(200, json={"success": True, "result_url": storage}),
    )
    server.add(
        "GET",
        "/logs/tok-77",
        httpx.Response(404, text="NoSuchKey"),
        httpx.Response(200, text=f"epoch 1\nCONTAINER_API_KEY=k123\n{API_KEY}\n"),
    )

    text = run(lambda h: h.get_instance_logs(7001, tail=50, retry=False))

    assert text == "epoch 1\nCONTAINER_API_KEY=***\n***\n"
    put, *gets = server.requests
    assert put.headers["Authorization"] == AUTH_HEADER
    assert json.loads(put.content) == {"tail": "50"}
    assert [str(g.url) for g in gets] == [storage, storage]
    assert all("authorization" not in g.headers for g in gets)


def test_async_log_never_uploaded_fails_after_the_bounded_tries(server, async_sleeps):
    from airflow_gpumarket import api
    from airflow_gpumarket.exceptions import GpuMarketError

    server.add(
        "PUT",
        "/api/v0/instances/request_logs/7001/",
        httpx.Response(200, json={"success": True, "result_url": "https://storage.example.net/logs/t"}),
    )
    server.add("GET", "/logs/t", httpx.Response(404))
    with pytest.raises(GpuMarketError, match="not at its result URL"):
        run(lambda h: h.get_instance_logs(7001))
    assert len(server.requests) == 1 + api.LOG_FETCH_TRIES


def test_async_change_bid_puts_the_live_body_to_the_bid_price_path(server):
    server.add("PUT", "/api/v0/instances/bid_price/7001/", httpx.Response(200, json={"success": True}))

    assert run(lambda h: h.change_bid(7001, 0.35)) == {"success": True}
    (request,) = server.requests
    assert request.method == "PUT" and json.loads(request.content) == {"client_id": "me", "price": 0.35}
