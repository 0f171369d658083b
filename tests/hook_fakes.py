"""The hook tests' fakes, shared by tests/hooks/ and tests/api/: the gpumarket connection, a hook whose logs caplog
can see, recorders for retry sleeps and ``mask_secret`` calls, and helpers to read what requests-mock saw.

No test using these touches the network (requests-mock / httpx.MockTransport) or really sleeps. Nothing here imports
Airflow at import time: the root conftest sets Airflow up first. Each folder's conftest.py imports the fixtures.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import requests_mock as requests_mock_lib

from airflow_gpumarket.hooks.gpumarket import GpuMarketAsyncHook

BASE_URL = "https://api.example.com"
#: The API key of the test connection. Long and distinctive, so a leak anywhere is found by a plain substring test.
API_KEY = "gmk-live-7f3c9a1b2d4e6f80-secret"
AUTH_HEADER = f"Bearer {API_KEY}"
CONN_ENV = "AIRFLOW_CONN_GPUMARKET_DEFAULT"
HOOK_LOGGER = "tests.unit.gpumarket_hook"
FAST_RETRIES = {"retry_min_wait": 0, "retry_max_wait": 0, "max_retries": 3}


def conn_json(
    host: str | None = BASE_URL, password: str | None = API_KEY, extra: dict | None = None, port: int | None = None
) -> str:
    """The JSON form of a gpumarket connection, as Airflow reads it from ``AIRFLOW_CONN_<ID>``."""
    conn: dict = {"conn_type": "gpumarket"}
    if host is not None:
        conn["host"] = host
    if password is not None:
        conn["password"] = password
    if port is not None:
        conn["port"] = port
    conn["extra"] = dict(FAST_RETRIES) if extra is None else extra
    return json.dumps(conn)


def use_stdlib_logger(hook):
    """Point the hook's ``log`` at a stdlib logger so caplog sees every record, DEBUG included.

    Airflow 3 hooks log through structlog, which bypasses caplog and drops records below INFO.
    """
    hook._log = logging.getLogger(HOOK_LOGGER)
    return hook


def url(path: str) -> str:
    return BASE_URL + path


def methods_and_urls(mocker) -> list[tuple[str, str]]:
    """(method, full URL) of every request requests-mock saw, in order."""
    return [(r.method, r.url) for r in mocker.request_history]


def methods_and_paths(mocker) -> list[tuple[str, str]]:
    """(method, full URL without its query) of every request requests-mock saw, in order."""
    return [(r.method, r.url.split("?")[0]) for r in mocker.request_history]


@pytest.fixture(autouse=True)
def gpumarket_conn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default connection: https://api.example.com, key API_KEY, instant retries, 3 retries."""
    monkeypatch.setenv(CONN_ENV, conn_json())


@pytest.fixture
def set_conn(monkeypatch: pytest.MonkeyPatch):
    """Replace the default connection: ``set_conn(host=..., password=..., extra=..., port=...)``."""

    def _set(**kwargs) -> None:
        monkeypatch.setenv(CONN_ENV, conn_json(**kwargs))

    return _set


@pytest.fixture(autouse=True)
def masked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every value the hook hands to ``mask_secret``.

    Replacing the real masker also means no test passes because Airflow's masker hid a leak: what the tests see
    is what the hook itself wrote.
    """
    calls: list[str] = []
    monkeypatch.setattr("airflow_gpumarket.hooks.core.mask_secret", calls.append)  # the account and instance keys
    monkeypatch.setattr("airflow_gpumarket.hooks.gpumarket.mask_secret", calls.append)  # backup codes
    return calls


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits tenacity asks for between tries (recorded, never slept: no test really sleeps).

    ``tenacity.nap.time`` is the ``time`` module itself, so only the main thread's sleeps are recorded; other
    threads (a simulator server left running by an earlier test) keep real time instead of spinning.
    """
    import time

    import tenacity

    recorded: list[float] = []
    real_sleep = tenacity.nap.time.sleep
    slept = [0.0]

    def fake_sleep(seconds: float) -> None:
        if threading.current_thread() is not threading.main_thread():
            real_sleep(seconds)
            return
        recorded.append(seconds)
        slept[0] += seconds

    class HookClock:
        """The ``time`` module as the hook and its pacer see it: a recorded sleep moves their clocks forward."""

        def __getattr__(self, name: str):
            return getattr(time, name)

        @staticmethod
        def monotonic() -> float:
            return time.monotonic() + slept[0]

        @staticmethod
        def time() -> float:  # the machine-wide list pacer books wall-clock slots
            return time.time() + slept[0]

        sleep = staticmethod(fake_sleep)

    monkeypatch.setattr(tenacity.nap.time, "sleep", fake_sleep)
    monkeypatch.setattr("airflow_gpumarket.hooks.gpumarket.time", HookClock())
    monkeypatch.setattr("airflow_gpumarket.hooks.core.time", HookClock())
    monkeypatch.setattr("airflow_gpumarket.pacing.time", HookClock())
    return recorded


@pytest.fixture
def hook():
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    return use_stdlib_logger(GpuMarketHook())


@pytest.fixture
def wire(requests_mock: requests_mock_lib.Mocker) -> requests_mock_lib.Mocker:
    """requests-mock with a catch-all that answers 200 {"success": true}: any request sent is recorded (and
    succeeds), so a validation test that expects nothing to be sent fails if something is."""
    requests_mock.register_uri(requests_mock_lib.ANY, requests_mock_lib.ANY, json={"success": True})
    return requests_mock


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


def page(instances, next_token=None, total=None):
    """One page of the live instance list, as requests-mock answers it."""
    return {
        "json": {
            "instances": instances,
            "instances_found": len(instances),
            "total_instances": len(instances) if total is None else total,
            "next_token": next_token,
        }
    }


def query(request) -> dict[str, str]:
    """A request's query parameters, one value each."""
    return {k: v[0] for k, v in parse_qs(urlsplit(request.url).query).items()}


def async_hook(monkeypatch, handler):
    """An async hook whose requests ``handler`` answers (httpx's MockTransport)."""
    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", conn_json())
    hook = GpuMarketAsyncHook()
    real = httpx.AsyncClient

    def client(**kwargs):
        return real(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    return hook
