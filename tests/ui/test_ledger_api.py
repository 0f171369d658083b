"""The budget ledger's routes in the api-server (Airflow 3 tasks reach the ledger through them), and the task's
client of them: signed with the connection's API key, refused otherwise, one ledger transaction each."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import create_engine

from airflow_gpumarket import budgets, ledger
from airflow_gpumarket._compat import is_airflow_2

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

KEY = "sekret-key"
CONN = "gpumarket_budget"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A test client of the plugin's app whose ledger is a fresh database; the connection's key is ``KEY``."""
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui import ledger_api

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(ledger_api, "_engine", lambda: engine)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    client = TestClient(app_module.create_app(), base_url="http://airflow.test")
    client.engine = engine
    return client


def signed(body: dict, key: str = KEY, stamp: float | None = None) -> dict:
    data = json.dumps(body, sort_keys=True).encode()
    when = str(int(time.time() if stamp is None else stamp))
    return {
        "content": data,
        "headers": {
            "Content-Type": "application/json",
            "X-GpuMarket-Timestamp": when,
            "X-GpuMarket-Signature": budgets.signature(key, when, data),
        },
    }


def request(worst: float = 0.4) -> dict:
    return ledger.Request(
        conn_id=CONN,
        dag_id="fanout",
        run_id="r1",
        task_id="job",
        map_index=0,
        try_number=1,
        worst=worst,
        seconds=3600,
        hourly=0.4,
        limits=budgets.Limits(day=1.0),
    ).to_json()


def test_a_signed_reservation_is_made_and_one_over_the_budget_answers_409_with_the_reason(server):
    assert server.post("/ledger/reserve", **signed(request())).json()["id"] == 1
    assert server.post("/ledger/reserve", **signed(request())).status_code == 200
    refused = server.post("/ledger/reserve", **signed(request()))
    assert refused.status_code == 409
    assert "day budget of DAG 'fanout' is $1.00" in refused.json()["detail"]
    assert len(ledger.entries(server.engine, since=0)) == 2


def test_a_request_signed_with_another_key_is_refused_and_reserves_nothing(server):
    answer = server.post("/ledger/reserve", **signed(request(), key="not-the-key"))
    assert answer.status_code == 401
    assert "does not match connection" in answer.json()["detail"]
    assert KEY not in answer.text


def test_a_stale_signature_is_refused(server):
    answer = server.post("/ledger/reserve", **signed(request(), stamp=time.time() - 3600))
    assert answer.status_code == 401


def test_a_connection_the_api_server_cannot_read_is_named(server):
    answer = server.post("/ledger/reserve", **signed({**request(), "conn_id": "nowhere"}))
    assert answer.status_code == 403
    assert "cannot read connection 'nowhere'" in answer.json()["detail"]


def test_a_malformed_reservation_is_a_400_naming_the_field(server):
    answer = server.post("/ledger/reserve", **signed({**request(), "worst": "lots"}))
    assert answer.status_code == 400
    assert "worst" in answer.json()["detail"]


def test_attach_then_settle_by_instance_and_read_the_entries(server):
    reservation = server.post("/ledger/reserve", **signed(request())).json()["id"]
    assert server.post("/ledger/attach", **signed({"conn_id": CONN, "id": reservation, "instance_id": 77})).is_success
    settled = server.post("/ledger/settle", **signed({"conn_id": CONN, "instance_id": 77}))
    assert settled.json()["cost"] is not None
    (entry,) = server.post("/ledger/entries", **signed({"conn_id": CONN, "since": 0})).json()["entries"]
    assert entry["instance_id"] == 77 and entry["cost"] == settled.json()["cost"]


def test_the_task_client_signs_its_requests_and_fails_with_the_budget_sentence(server, monkeypatch):
    import requests

    from airflow_gpumarket.operators import budget

    def post(url, data, headers, timeout):  # requests.post, answered by the test client
        answer = server.post(url.removeprefix("http://airflow.test/gpumarket"), content=data, headers=headers)
        reply = requests.Response()
        reply.status_code, reply._content = answer.status_code, answer.content
        return reply

    monkeypatch.setattr(requests, "post", post)
    client = budget._ApiServer("http://airflow.test", KEY)
    asked = ledger.Request.from_json(request(worst=0.6))
    assert client.reserve(asked) == 1
    with pytest.raises(ledger.BudgetRefused, match="day budget"):
        client.reserve(asked)


def test_an_airflow_3_task_process_reaches_the_ledger_through_the_execution_apis_host(monkeypatch):
    from airflow import settings

    from airflow_gpumarket.operators import budget

    blocked = type("Blocked", (), {"url": "airflow-db-not-allowed:///"})()  # what Airflow 3 leaves a task process
    monkeypatch.setattr(settings, "engine", blocked, raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "http://api.internal:8080/execution/")
    monkeypatch.delenv("AIRFLOW__GPUMARKET__LEDGER_URL", raising=False)
    hook = type("Hook", (), {"settings": type("Settings", (), {"api_key": KEY})()})()
    client = budget.ledger_client(hook)
    assert isinstance(client, budget._ApiServer)
    assert client.url == "http://api.internal:8080/gpumarket/ledger"
    monkeypatch.setenv("AIRFLOW__GPUMARKET__LEDGER_URL", "https://airflow.example.com/")
    assert budget.ledger_client(hook).url == "https://airflow.example.com/gpumarket/ledger"
