"""The budget ledger's routes in the api-server (Airflow 3 tasks reach the ledger through them), and the task's
client of them: signed with the connection's API key, refused otherwise, one ledger transaction each."""

from __future__ import annotations

import json
import secrets
import time

import pytest

from airflow_gpumarket import ledger, signing
from airflow_gpumarket._compat import is_airflow_2

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

KEY = "sekret-key"
CONN = "gpumarket_budget"


def signed(
    route: str,
    body: dict,
    key: str = KEY,
    stamp: float | None = None,
    nonce: str | None = None,
    conn_id: str | None = None,
) -> dict:
    """A POST to ``route`` as the wire wants it: HMAC of the key over method, route, connection, time, nonce, body.

    The body is written as Python's json writes it, NaN and Infinity included (as a careless client would).
    """
    data = json.dumps(body, sort_keys=True).encode()
    parts = {
        "conn_id": conn_id or body.get("conn_id") or CONN,
        "timestamp": str(int(time.time() if stamp is None else stamp)),
        "nonce": nonce or secrets.token_hex(16),
    }
    mac = signing.signature(key, method="POST", route=route, body=data, **parts)
    return {"content": data, "headers": {"Content-Type": "application/json", **signing.headers(signature=mac, **parts)}}


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
    made = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()
    assert made == {"id": 1, "limits": {"day": 1.0}, "warnings": []}
    assert server.post("/ledger/reserve", **signed("/ledger/reserve", request(attempt=2))).status_code == 200
    refused = server.post("/ledger/reserve", **signed("/ledger/reserve", request(attempt=3)))
    assert refused.status_code == 409
    assert "day budget of DAG 'fanout' is $1.00" in refused.json()["detail"]
    assert len(ledger.entries(server.engine, since=0)) == 2


def test_a_replayed_signed_reservation_is_refused_and_reserves_nothing_more(server):
    captured = signed("/ledger/reserve", request())
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
    server.post("/ledger/reserve", **signed("/ledger/reserve", request()))
    captured = signed(f"/ledger/{name}", body)
    assert server.post(f"/ledger/{name}", **captured).status_code == 200
    assert server.post(f"/ledger/{name}", **captured).status_code == 401


def test_a_retried_reservation_after_a_lost_answer_returns_the_first(server):
    first = server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.6))).json()["id"]
    # The answer was lost: the task signs the same reservation again (a new nonce, the same idempotency key).
    again = server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.6)))
    assert again.status_code == 200 and again.json()["id"] == first  # $1.20 would not fit: it is the same one
    assert len(ledger.entries(server.engine, since=0)) == 1


def test_a_body_whose_limits_differ_from_the_variable_is_reserved_against_the_variables(server):
    generous = {"day": 100.0}  # what a task (or an edited replay) could claim
    assert server.post(
        "/ledger/reserve", **signed("/ledger/reserve", {**request(worst=0.6), "limits": generous})
    ).is_success
    refused = server.post(
        "/ledger/reserve", **signed("/ledger/reserve", {**request(worst=0.6, attempt=2), "limits": generous})
    )
    assert refused.status_code == 409
    assert "day budget of DAG 'fanout' is $1.00" in refused.json()["detail"]


def test_an_unsigned_caller_cannot_tell_connections_apart(server, caplog):
    known = server.post("/ledger/reserve", **signed("/ledger/reserve", request(), key="not-the-key"))
    nowhere = {**request(), "conn_id": "nowhere"}
    unknown = server.post("/ledger/reserve", **signed("/ledger/reserve", nowhere, key="not-the-key", conn_id="nowhere"))
    assert (known.status_code, known.json()) == (unknown.status_code, unknown.json())
    assert known.status_code == 401 and KEY not in known.text
    assert "cannot read" not in known.text and "nowhere" not in unknown.text
    assert "names connection 'nowhere', which the api-server cannot read" in caplog.text  # for its operator
    assert ledger.entries(server.engine, since=0) == []


def test_a_stale_signature_is_refused(server):
    answer = server.post("/ledger/reserve", **signed("/ledger/reserve", request(), stamp=time.time() - 3600))
    assert answer.status_code == 401


def test_a_request_without_a_nonce_is_refused(server):
    unsigned = signed("/ledger/reserve", request())
    del unsigned["headers"]["X-GpuMarket-Nonce"]
    answer = server.post("/ledger/reserve", **unsigned)
    assert answer.status_code == 401 and "X-GpuMarket-Nonce" in answer.json()["detail"]


def test_a_malformed_reservation_is_a_400_naming_the_field(server):
    answer = server.post("/ledger/reserve", **signed("/ledger/reserve", {**request(), "worst": "lots"}))
    assert answer.status_code == 400
    assert "worst" in answer.json()["detail"]


@pytest.mark.parametrize("cost", [-0.01, "0.5", True, float("inf")])
def test_a_settle_with_a_cost_that_is_no_amount_is_a_400_naming_the_field(server, cost):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    answer = server.post(
        "/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "id": reservation, "cost": cost})
    )
    assert answer.status_code == 400 and "cost" in answer.json()["detail"]


def test_a_settle_with_the_tasks_cost_settles_at_it(server):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    server.post("/ledger/attach", **signed("/ledger/attach", {"conn_id": CONN, "id": reservation, "instance_id": 78}))
    settled = server.post(
        "/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "instance_id": 78, "cost": 0.01234})
    )
    assert settled.json()["cost"] == 0.0124  # rounded up to the ledger's cents of a cent


def test_the_api_servers_versions_are_told_to_a_signed_caller_only(server):
    from airflow_gpumarket import __version__

    answer = server.post("/ledger/version", **signed("/ledger/version", {"conn_id": CONN}))
    assert answer.status_code == 200 and answer.json()["provider"] == __version__
    assert server.post("/ledger/version", json={"conn_id": CONN}).status_code == 401


def test_attach_then_settle_by_instance_and_read_the_entries(server):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    attach = {"conn_id": CONN, "id": reservation, "instance_id": 77}
    assert server.post("/ledger/attach", **signed("/ledger/attach", attach)).is_success
    assert server.post("/ledger/attach", **signed("/ledger/attach", attach)).is_success  # a retried attach: the same
    settled = server.post("/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "instance_id": 77}))
    assert settled.json()["cost"] is not None
    retried = server.post("/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "instance_id": 77}))
    assert retried.json() == settled.json()
    (entry,) = server.post("/ledger/entries", **signed("/ledger/entries", {"conn_id": CONN, "since": 0})).json()[
        "entries"
    ]
    assert entry["instance_id"] == 77 and entry["cost"] == settled.json()["cost"]


def test_the_last_attempt_of_a_task_try_is_read_for_a_resumed_task(server):
    task_try = {"conn_id": CONN, "dag_id": "fanout", "run_id": "r1", "task_id": "job", "map_index": 0, "try_number": 1}
    assert server.post("/ledger/attempts", **signed("/ledger/attempts", task_try)).json() == {"last": 0}
    server.post("/ledger/reserve", **signed("/ledger/reserve", request(attempt=2)))
    assert server.post("/ledger/attempts", **signed("/ledger/attempts", task_try)).json() == {"last": 2}


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
        assert server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.4))).json()["limits"] == {
            "day": 0.5
        }
        refused = server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.4, attempt=2)))
    finally:
        Variable.delete("gpumarket_budgets")
    assert refused.status_code == 409 and "is $0.50" in refused.json()["detail"]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("field", "value"),
    [("worst", NAN), ("worst", INF), ("seconds", NAN), ("hourly", INF), ("started", NAN), ("available", -INF)],
)
def test_rule_a_reservation_with_a_number_that_is_not_finite_answers_400_naming_it(server, field, value):
    answer = server.post("/ledger/reserve", **signed("/ledger/reserve", {**request(), field: value}))
    assert answer.status_code == 400 and answer.json()["detail"].startswith(f"{field}: ")
    assert ledger.entries(server.engine, since=0) == []


def test_rule_a_nan_reservation_cannot_stop_a_window_counting(server):
    server.post("/ledger/reserve", **signed("/ledger/reserve", {**request(), "worst": NAN}))
    assert server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.6, attempt=2))).is_success
    refused = server.post("/ledger/reserve", **signed("/ledger/reserve", request(worst=0.6, attempt=3)))
    assert refused.status_code == 409  # $1.20 against $1.00 a day: the window still counts


@pytest.mark.parametrize("ended", [NAN, -INF, INF])
def test_rule_a_settle_with_an_end_that_is_not_finite_answers_400_and_settles_nothing(server, ended):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    server.post("/ledger/attach", **signed("/ledger/attach", {"conn_id": CONN, "id": reservation, "instance_id": 7}))
    answer = server.post(
        "/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "id": reservation, "ended": ended})
    )
    assert answer.status_code == 400 and answer.json()["detail"].startswith("ended: ")
    (entry,) = ledger.entries(server.engine, since=0)
    assert entry["cost"] is None


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("/ledger/reserve", "map_index", 2**31),
        ("/ledger/reserve", "try_number", 10**20),
        ("/ledger/reserve", "dag_id", "d" * 251),
        ("/ledger/reserve", "run_id", "run\x00"),
        ("/ledger/reserve", "task_id", "\ud800"),
        ("/ledger/reserve", "team", "t" * 251),
        ("/ledger/attempts", "map_index", 2**31),
        ("/ledger/attach", "instance_id", 2**63),
        ("/ledger/attach", "id", 2**31),
        ("/ledger/settle", "ended", INF),
        ("/ledger/settle", "cost", 1e10),
        ("/ledger/entries", "since", NAN),
    ],
)
def test_rule_signed_bad_input_answers_400_naming_the_field_and_writes_nothing(server, route, field, value):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    bodies = {
        "/ledger/reserve": request(attempt=2),
        "/ledger/attempts": {
            k: v
            for k, v in request().items()
            if k in ("conn_id", "dag_id", "run_id", "task_id", "map_index", "try_number")
        },  # fmt: skip
        "/ledger/attach": {"conn_id": CONN, "id": reservation, "instance_id": 7},
        "/ledger/settle": {"conn_id": CONN, "id": reservation},
        "/ledger/entries": {"conn_id": CONN, "since": 0},
    }
    before = ledger.entries(server.engine, since=0)
    answer = server.post(route, **signed(route, {**bodies[route], field: value}))
    assert answer.status_code == 400 and answer.json()["detail"].startswith(f"{field}: "), answer.text
    assert ledger.entries(server.engine, since=0) == before


def test_rule_a_settled_reservation_is_final_and_attach_after_settle_answers_409(server):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    server.post("/ledger/attach", **signed("/ledger/attach", {"conn_id": CONN, "id": reservation, "instance_id": 7}))
    server.post("/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "instance_id": 7, "cost": 0.05}))
    moved = server.post(
        "/ledger/attach", **signed("/ledger/attach", {"conn_id": CONN, "id": reservation, "instance_id": 8})
    )
    assert moved.status_code == 409 and "settled" in moved.json()["detail"]
    (entry,) = ledger.entries(server.engine, since=0)
    assert (entry["instance_id"], entry["cost"]) == (7, 0.05)
    again = server.post("/ledger/settle", **signed("/ledger/settle", {"conn_id": CONN, "instance_id": 7}))
    assert again.json() == {"cost": 0.05}  # the first instance's settle still finds its reservation


def test_rule_attach_to_a_reservation_the_connection_does_not_have_answers_404(server):
    answer = server.post("/ledger/attach", **signed("/ledger/attach", {"conn_id": CONN, "id": 99, "instance_id": 7}))
    assert answer.status_code == 404


def test_rule_the_task_client_sends_no_number_that_is_not_finite(server, monkeypatch):
    import requests

    from airflow_gpumarket.exceptions import GpuMarketValidationError
    from airflow_gpumarket.operators import budget

    sent = []
    monkeypatch.setattr(requests, "post", lambda *args, **kwargs: sent.append(args))
    client = budget._ApiServer("http://airflow.test", KEY)
    with pytest.raises(GpuMarketValidationError, match="ended: must be a finite number"):
        client.settle(CONN, reservation_id=1, ended=NAN)
    assert sent == []
