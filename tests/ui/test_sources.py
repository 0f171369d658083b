"""Where the GPU rentals page reads from (ui/sources.py): the configured connections, and one listing per connection
reused for a few seconds. Its queries of the metadata database are tested with the page, in
tests/integration/test_gpu_rentals_page*.py."""

from __future__ import annotations

import pytest

from airflow_gpumarket.exceptions import GpuMarketNotFoundError
from airflow_gpumarket.ui import sources


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def service(monkeypatch):
    """A hook per connection whose list answers that connection's instances; every list call is recorded."""
    from airflow_gpumarket.hooks import gpumarket

    calls: list[str] = []

    class Hook:
        default_conn_name = "gpumarket_default"
        service_clock_offset = 2.5

        def __init__(self, conn_id) -> None:
            self.conn_id = conn_id

        def list_instances(self):
            calls.append(self.conn_id)
            return [{"id": len(calls), "conn": self.conn_id}]

        def charges(self, start, end):
            calls.append(("charges", self.conn_id, start, end))
            if self.conn_id == "spec":
                raise GpuMarketNotFoundError("charges: this service has no GET /api/v0/charges/ (HTTP 404).")
            return [len(calls)]

        def account(self):
            calls.append(("account", self.conn_id))
            return len(calls)

    clock = Clock()
    monkeypatch.setattr(gpumarket, "GpuMarketHook", Hook)
    monkeypatch.setattr(sources, "time", clock)
    monkeypatch.setattr(sources, "_listings", {})
    monkeypatch.setattr(sources, "_charges", {})
    monkeypatch.setattr(sources, "_accounts", {})
    return calls, clock


def test_a_connections_listing_is_reused_for_a_few_seconds_then_listed_again(service):
    calls, clock = service
    first = sources.listing("a")
    assert first == ([{"id": 1, "conn": "a"}], 2.5)
    clock.now += sources.LISTING_CACHE_SECONDS - 0.1
    assert sources.listing("a") == first and calls == ["a"]  # opening and refreshing the page: one list call
    clock.now += 0.2
    assert sources.listing("a")[0] == [{"id": 2, "conn": "a"}] and calls == ["a", "a"]


def test_each_connection_has_its_own_listing_and_a_forgotten_one_is_listed_again(service):
    calls, _ = service
    sources.listing("a")
    sources.listing("b")
    sources.forget_listing("a")  # before a destroy: decide on a fresh listing
    sources.listing("a")
    sources.listing("b")
    assert calls == ["a", "b", "a"]


def test_the_configured_connections_are_the_pages_without_asking_the_database(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPUMARKET__UI_CONNECTIONS", " prod, , staging ")
    assert sources.connection_ids(session=None) == ["prod", "staging"]


def test_a_connections_charges_and_account_are_read_once_then_reused_for_a_while(service):
    calls, clock = service
    first = sources.charges("a", 100.0, 200.0)
    clock.now += sources.MONEY_CACHE_SECONDS - 1
    assert sources.charges("a", 100.0, 250.0) == first  # the page's refreshes: from the same midnight to now
    assert sources.account("a") is sources.account("a")  # the answer read once, then the same object
    sources.charges("a", 50.0, 250.0)  # another window: read
    sources.charges("b", 100.0, 250.0)  # another connection: read
    assert calls == [("charges", "a", 100.0, 200.0), ("account", "a"), ("charges", "a", 50.0, 250.0)] + [
        ("charges", "b", 100.0, 250.0)
    ]
    clock.now += 2
    assert sources.charges("a", 100.0, 300.0) != first and calls[-1] == ("charges", "a", 100.0, 300.0)


def test_a_service_without_charges_is_asked_once_a_while_and_the_page_told_each_time(service):
    calls, clock = service
    for _ in range(3):
        with pytest.raises(GpuMarketNotFoundError, match="no GET /api/v0/charges/"):
            sources.charges("spec", 100.0, 200.0)
    assert calls == [("charges", "spec", 100.0, 200.0)]
    clock.now += sources.MONEY_CACHE_SECONDS
    with pytest.raises(GpuMarketNotFoundError):
        sources.charges("spec", 100.0, 200.0)
    assert len(calls) == 2


def test_the_avoided_machines_are_each_accounts_once_named_by_the_connections_that_share_its_key(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from sqlalchemy import create_engine

    from airflow_gpumarket import host_memory
    from airflow_gpumarket.exceptions import GpuMarketAuthError
    from airflow_gpumarket.hooks import gpumarket

    keys = {"prod": "key-1", "prod_copy": "key-1", "staging": "key-2"}

    class Hook:
        def __init__(self, conn_id) -> None:
            if conn_id not in keys:
                raise GpuMarketAuthError(f"connection {conn_id!r} has no API key (its password)")
            self.settings = SimpleNamespace(api_key=keys[conn_id])

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(gpumarket, "GpuMarketHook", Hook)
    monkeypatch.setattr(sources, "_engine", lambda: engine)
    now = 1_800_000_000.0
    host_memory.remember(engine, host_memory.account_of("key-1"), 11, "preflight", now=now - 60, detail="no GPU")
    host_memory.remember(engine, host_memory.account_of("key-2"), 12, "offline", now=now - 30)
    host_memory.remember(engine, host_memory.account_of("key-2"), 13, "lost", now=now - 7200, ttl=3600)  # expired
    errors: list[str] = []
    found = sources.avoided_machines(["prod", "prod_copy", "staging", "broken"], now, errors)
    assert [(names, m.machine_id) for names, m in found] == [(("staging",), 12), (("prod", "prod_copy"), 11)]
    assert errors == [
        "Could not read the host memory of connection 'broken': connection 'broken' has no API key (its password)"
    ]
