"""The budget ledger's routes in the api-server (Airflow 3 tasks reach the ledger through them), and the task's
client of them: signed with the connection's API key, refused otherwise, one ledger transaction each."""

from __future__ import annotations

import json
import secrets
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
    """A test client of the plugin's app whose ledger is a fresh database; the connection's key is ``KEY``, and DAG
    ``fanout`` may spend $1 a day."""
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui import ledger_api

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(ledger_api, "metadata_engine", lambda: engine)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"fanout": {"day": 1.0}}))
    client = TestClient(app_module.create_app(), base_url="http://airflow.test")
    client.engine = engine
    return client


def signed(body: dict, key: str = KEY, stamp: float | None = None, nonce: str | None = None) -> dict:
    """A request's content and headers as the wire wants them: HMAC of the key over timestamp, nonce and body."""
    data = json.dumps(body, sort_keys=True).encode()
    when = str(int(time.time() if stamp is None else stamp))
    nonce = nonce or secrets.token_hex(16)
    return {
        "content": data,
        "headers": {
            "Content-Type": "application/json",
            "X-GpuMarket-Timestamp": when,
            "X-GpuMarket-Nonce": nonce,
            "X-GpuMarket-Signature": budgets.signature(key, when, nonce, data),
        },
    }


def request(worst: float = 0.4, attempt: int = 1) -> dict:
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
        attempt=attempt,
    ).to_json()


def test_a_signed_reservation_is_made_and_one_over_the_budget_answers_409_with_the_reason(server):
    made = server.post("/ledger/reserve", **signed(request())).json()
    assert made == {"id": 1, "limits": {"day": 1.0}, "warnings": []}
    assert server.post("/ledger/reserve", **signed(request(attempt=2))).status_code == 200
    refused = server.post("/ledger/reserve", **signed(request(attempt=3)))
    assert refused.status_code == 409
    assert "day budget of DAG 'fanout' is $1.00" in refused.json()["detail"]
    assert len(ledger.entries(server.engine, since=0)) == 2


def test_a_replayed_signed_reservation_is_refused_and_reserves_nothing_more(server):
    captured = signed(request())
    assert server.post("/ledger/reserve", **captured).status_code == 200
    replayed = server.post("/ledger/reserve", **captured)  # the same bytes, well within the window
    assert replayed.status_code == 401
    assert "received before" in replayed.json()["detail"]
    assert len(ledger.entries(server.engine, since=0)) == 1


@pytest.mark.parametrize(
    "route",
    [
        ("attach", {"conn_id": CONN, "id": 1, "instance_id": 77}),
        ("settle", {"conn_id": CONN, "id": 1}),
        ("entries", {"conn_id": CONN, "since": 0}),
    ],
)
def test_a_replay_of_any_route_is_refused(server, route):
    name, body = route
    server.post("/ledger/reserve", **signed(request()))
    captured = signed(body)
    assert server.post(f"/ledger/{name}", **captured).status_code == 200
    assert server.post(f"/ledger/{name}", **captured).status_code == 401


def test_a_retried_reservation_after_a_lost_answer_returns_the_first(server):
    first = server.post("/ledger/reserve", **signed(request(worst=0.6))).json()["id"]
    # The answer was lost: the task signs the same reservation again (a new nonce, the same idempotency key).
    again = server.post("/ledger/reserve", **signed(request(worst=0.6)))
    assert again.status_code == 200 and again.json()["id"] == first  # $1.20 would not fit: it is the same one
    assert len(ledger.entries(server.engine, since=0)) == 1


def test_a_body_whose_limits_differ_from_the_variable_is_reserved_against_the_variables(server):
    generous = {"day": 100.0}  # what a task (or an edited replay) could claim
    assert server.post("/ledger/reserve", **signed({**request(worst=0.6), "limits": generous})).is_success
    refused = server.post("/ledger/reserve", **signed({**request(worst=0.6, attempt=2), "limits": generous}))
    assert refused.status_code == 409
    assert "day budget of DAG 'fanout' is $1.00" in refused.json()["detail"]


def test_an_unsigned_caller_cannot_tell_connections_apart(server, caplog):
    known = server.post("/ledger/reserve", **signed(request(), key="not-the-key"))
    unknown = server.post("/ledger/reserve", **signed({**request(), "conn_id": "nowhere"}, key="not-the-key"))
    assert (known.status_code, known.json()) == (unknown.status_code, unknown.json())
    assert known.status_code == 401 and KEY not in known.text
    assert "cannot read" not in known.text and "nowhere" not in unknown.text
    assert "names connection 'nowhere', which the api-server cannot read" in caplog.text  # for its operator
    assert ledger.entries(server.engine, since=0) == []


def test_a_stale_signature_is_refused(server):
    answer = server.post("/ledger/reserve", **signed(request(), stamp=time.time() - 3600))
    assert answer.status_code == 401


def test_a_request_without_a_nonce_is_refused(server):
    unsigned = signed(request())
    del unsigned["headers"]["X-GpuMarket-Nonce"]
    answer = server.post("/ledger/reserve", **unsigned)
    assert answer.status_code == 401 and "X-GpuMarket-Nonce" in answer.json()["detail"]


def test_a_malformed_reservation_is_a_400_naming_the_field(server):
    answer = server.post("/ledger/reserve", **signed({**request(), "worst": "lots"}))
    assert answer.status_code == 400
    assert "worst" in answer.json()["detail"]


@pytest.mark.parametrize("cost", [-0.01, "0.5", True, float("inf")])
def test_a_settle_with_a_cost_that_is_no_amount_is_a_400_naming_the_field(server, cost):
    reservation = server.post("/ledger/reserve", **signed(request())).json()["id"]
    answer = server.post("/ledger/settle", **signed({"conn_id": CONN, "id": reservation, "cost": cost}))
    assert answer.status_code == 400 and "cost" in answer.json()["detail"]


def test_a_settle_with_the_tasks_cost_settles_at_it(server):
    reservation = server.post("/ledger/reserve", **signed(request())).json()["id"]
    server.post("/ledger/attach", **signed({"conn_id": CONN, "id": reservation, "instance_id": 78}))
    settled = server.post("/ledger/settle", **signed({"conn_id": CONN, "instance_id": 78, "cost": 0.01234}))
    assert settled.json()["cost"] == 0.0124  # rounded up to the ledger's cents of a cent


def test_the_api_servers_versions_are_told_to_a_signed_caller_only(server):
    from airflow_gpumarket import __version__

    answer = server.post("/ledger/version", **signed({"conn_id": CONN}))
    assert answer.status_code == 200 and answer.json()["provider"] == __version__
    assert server.post("/ledger/version", json={"conn_id": CONN}).status_code == 401


def test_attach_then_settle_by_instance_and_read_the_entries(server):
    reservation = server.post("/ledger/reserve", **signed(request())).json()["id"]
    attach = {"conn_id": CONN, "id": reservation, "instance_id": 77}
    assert server.post("/ledger/attach", **signed(attach)).is_success
    assert server.post("/ledger/attach", **signed(attach)).is_success  # a retried attach: the same
    settled = server.post("/ledger/settle", **signed({"conn_id": CONN, "instance_id": 77}))
    assert settled.json()["cost"] is not None
    retried = server.post("/ledger/settle", **signed({"conn_id": CONN, "instance_id": 77}))
    assert retried.json() == settled.json()
    (entry,) = server.post("/ledger/entries", **signed({"conn_id": CONN, "since": 0})).json()["entries"]
    assert entry["instance_id"] == 77 and entry["cost"] == settled.json()["cost"]


def test_the_last_attempt_of_a_task_try_is_read_for_a_resumed_task(server):
    task_try = {"conn_id": CONN, "dag_id": "fanout", "run_id": "r1", "task_id": "job", "map_index": 0, "try_number": 1}
    assert server.post("/ledger/attempts", **signed(task_try)).json() == {"last": 0}
    server.post("/ledger/reserve", **signed(request(attempt=2)))
    assert server.post("/ledger/attempts", **signed(task_try)).json() == {"last": 2}


def answered_by(server, lost: int = 0):
    """``requests.post`` answered by the test client; the first ``lost`` answers are lost after the server acted."""
    import requests

    def post(url, data, headers, timeout):
        answer = server.post(url.removeprefix("http://airflow.test/gpumarket"), content=data, headers=headers)
        if post.lost:
            post.lost -= 1
            raise requests.ConnectionError("connection reset")
        reply = requests.Response()
        reply.status_code, reply._content = answer.status_code, answer.content
        return reply

    post.lost = lost
    return post


def test_the_task_client_signs_its_requests_and_fails_with_the_budget_sentence(server, monkeypatch):
    import requests

    from airflow_gpumarket.operators import budget

    monkeypatch.setattr(requests, "post", answered_by(server))
    client = budget._ApiServer("http://airflow.test", KEY)
    assert client.reserve(ledger.Request.from_json(request(worst=0.6))).id == 1
    with pytest.raises(ledger.BudgetRefused, match="day budget"):
        client.reserve(ledger.Request.from_json(request(worst=0.6, attempt=2)))


def test_the_task_client_asks_again_after_a_lost_answer_and_gets_the_first_reservation(server, monkeypatch):
    import requests

    from airflow_gpumarket.operators import budget

    monkeypatch.setattr(requests, "post", answered_by(server, lost=2))
    client = budget._ApiServer("http://airflow.test", KEY)
    assert client.reserve(ledger.Request.from_json(request(worst=0.6))).id == 1
    assert len(ledger.entries(server.engine, since=0)) == 1


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


def test_the_budgets_are_read_from_the_variable_in_the_metadata_database(server, monkeypatch, airflow_db):
    from airflow.models import Variable

    monkeypatch.delenv("AIRFLOW_VAR_GPUMARKET_BUDGETS")
    Variable.set("gpumarket_budgets", json.dumps({"fanout": {"day": 0.5}}))  # as Admin > Variables stores it
    try:
        assert server.post("/ledger/reserve", **signed(request(worst=0.4))).json()["limits"] == {"day": 0.5}
        refused = server.post("/ledger/reserve", **signed(request(worst=0.4, attempt=2)))
    finally:
        Variable.delete("gpumarket_budgets")
    assert refused.status_code == 409 and "is $0.50" in refused.json()["detail"]
