"""Host memory's routes in the api-server (Airflow 3 tasks reach it through them) and the task's client of them."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine

from airflow_gpumarket import host_memory
from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.exceptions import GpuMarketValidationError

from .test_ledger_api import KEY, answered_by, signed

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

CONN = "gpumarket_hosts"


@pytest.fixture
def server(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui import verify

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(verify, "metadata_engine", lambda: engine)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    client = TestClient(app_module.create_app(), base_url="http://airflow.test")
    client.engine = engine
    return client


def test_a_signed_remember_is_kept_for_the_account_of_the_connections_key(server):
    body = {"conn_id": CONN, "machine_id": 11, "reason": "preflight", "detail": "no driver", "ttl_seconds": 60}
    made = server.post("/hosts/remember", **signed("/hosts/remember", body)).json()
    assert (made["machine_id"], made["failures"]) == (11, 1)
    account = host_memory.account_of(KEY)
    assert list(host_memory.avoided(server.engine, account, now=made["remembered_at"])) == [11]
    listed = server.post("/hosts/avoided", **signed("/hosts/avoided", {"conn_id": CONN})).json()["machines"]
    assert [m["machine_id"] for m in listed] == [11]


def test_a_request_signed_with_another_key_is_refused(server):
    body = {"conn_id": CONN, "machine_id": 11, "reason": "preflight"}
    assert server.post("/hosts/remember", **signed("/hosts/remember", body, key="not-the-key")).status_code == 401
    assert (
        server.post("/hosts/avoided", **signed("/hosts/avoided", {"conn_id": CONN}, key="not-the-key")).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"machine_id": "11", "reason": "preflight"}, "machine_id"),
        ({"machine_id": 11, "reason": "preflight", "ttl_seconds": 0}, "ttl_seconds"),
        ({"machine_id": 11, "reason": "preflight", "ttl_seconds": -1}, "ttl_seconds"),
        ({"machine_id": 11, "reason": "tired"}, "reason"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, field):
    answer = server.post("/hosts/remember", **signed("/hosts/remember", {"conn_id": CONN, **body}))
    assert answer.status_code == 400 and answer.json()["detail"].startswith(f"{field}: ")


def test_clear_needs_a_machine_or_all(server):
    answer = server.post("/hosts/clear", **signed("/hosts/clear", {"conn_id": CONN}))
    assert answer.status_code == 400 and "all: true" in answer.json()["detail"]
    assert (
        server.post("/hosts/clear", **signed("/hosts/clear", {"conn_id": CONN, "machine_id": "x"})).status_code == 400
    )


def test_the_task_client_remembers_lists_and_clears_through_the_routes(server, monkeypatch):
    import requests

    from airflow_gpumarket.operators.host_memory_client import ApiServerHostMemory

    monkeypatch.setattr(requests, "post", answered_by(server))
    client = ApiServerHostMemory("http://airflow.test", KEY, CONN)
    client.remember(11, "boot_timeout", detail="not running after 900 s")
    client.remember(12, "offline")
    assert sorted(client.avoided()) == [11, 12]
    assert client.clear(11) == 1 and sorted(client.avoided()) == [12]
    assert client.clear() == 1 and client.avoided() == {}
    with pytest.raises(GpuMarketValidationError, match="ttl_seconds"):
        client.remember(11, "offline", ttl=0)
