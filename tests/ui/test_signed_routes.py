"""The check every signed route runs first (ui/verify.py), probed as an attacker on the network or a hostile DAG
author would: route confusion, connections told apart, connections of other types, and work before the signature."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_gpumarket import ledger, signing
from airflow_gpumarket._compat import is_airflow_2

from .route_fuzz import ROUTES, valid_bodies
from .test_ledger_api import CONN, KEY, request, signed

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

HTTP_CONN = "http_with_a_password"


@pytest.fixture(autouse=True)
def http_connection(monkeypatch):
    """An ``http`` connection whose password is the gpumarket connection's key."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{HTTP_CONN.upper()}", json.dumps({"conn_type": "http", "password": KEY}))


def test_rule_a_request_signed_for_attach_and_delivered_to_settle_answers_401(server):
    reservation = server.post("/ledger/reserve", **signed("/ledger/reserve", request())).json()["id"]
    captured = signed("/ledger/attach", {"conn_id": CONN, "id": reservation, "instance_id": 9101})
    moved = server.post("/ledger/settle", **captured)
    assert moved.status_code == 401
    (entry,) = ledger.entries(server.engine, since=0)
    assert entry["cost"] is None and entry["instance_id"] is None  # still open, still unattached
    assert server.post("/ledger/attach", **captured).status_code == 200  # where it was signed for, it is accepted


@pytest.mark.parametrize("signed_for", ROUTES)
def test_rule_a_request_signed_for_one_route_answers_401_on_every_other(server, signed_for):
    body = valid_bodies(CONN)[signed_for]
    for route in ROUTES:
        if route != signed_for:
            answer = server.post(route, **signed(signed_for, body))
            assert answer.status_code == 401, (signed_for, route, answer.text)


@pytest.mark.parametrize("signature", ["é" * 64, "A" * 64, "not hex", ""])
def test_rule_a_malformed_signature_answers_the_same_401_for_known_and_unknown_connections(server, signature):
    answers = []
    for conn_id in (CONN, "gpumarket_nowhere"):
        sent = signed("/ledger/version", {"conn_id": conn_id}, conn_id=conn_id)
        sent["headers"][signing.SIGNATURE] = signature.encode()
        answer = server.post("/ledger/version", **sent)
        answers.append((answer.status_code, answer.json()))
    assert answers[0] == answers[1] and answers[0][0] == 401


def test_rule_a_wrong_signature_takes_the_same_path_for_known_and_unknown_connections(server, monkeypatch):
    """An unknown connection is checked against a key nobody holds: the same HMAC and comparison run, and the answer
    waits for the same floor after the lookup began."""
    import time

    from airflow_gpumarket.ui import verify

    compared, waited = [], []
    monkeypatch.setattr(verify.signing, "matches", lambda a, b: compared.append((len(a), len(b))) or False)
    monkeypatch.setattr(verify, "UNSIGNED_FLOOR_SECONDS", 0.25)

    async def not_before(moment):
        waited.append(moment - time.monotonic())

    monkeypatch.setattr(verify, "_not_before", not_before)
    for conn_id in (CONN, "gpumarket_nowhere"):
        server.post("/ledger/version", **signed("/ledger/version", {"conn_id": conn_id}, key="wrong", conn_id=conn_id))
    assert compared == [(64, 64), (64, 64)]
    assert len(waited) == 2 and all(0 < wait <= 0.25 for wait in waited), waited


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/ledger/version", {}),
        ("/ledger/reserve", request(worst=4.99)),
        ("/history/learned", {"dag_id": "d", "task_id": "t"}),
    ],
)
def test_rule_only_connections_of_the_providers_type_sign(server, route, body):
    answer = server.post(route, **signed(route, {**body, "conn_id": HTTP_CONN}, conn_id=HTTP_CONN))
    assert answer.status_code == 401
    assert ledger.entries(server.engine, since=0) == []


@pytest.mark.parametrize(
    ("header", "value"),
    [(signing.TIMESTAMP, "²"), (signing.TIMESTAMP, "1" * 400), (signing.NONCE, "x"), (signing.CONNECTION, "%FF")],
)
def test_rule_a_malformed_header_answers_401_naming_it(server, header, value):
    sent = signed("/ledger/version", {"conn_id": CONN})
    sent["headers"][header] = value.encode()
    answer = server.post("/ledger/version", **sent)
    assert answer.status_code == 401 and header in answer.json()["detail"]


def test_rule_a_body_is_not_parsed_before_its_signature_verifies(server, monkeypatch):
    from airflow_gpumarket.ui import verify

    nested = b"[" * 60_000  # deeper than the parser's recursion limit, under the size limit
    parsed = []
    monkeypatch.setattr(verify, "_json_object", lambda data: parsed.append(data) or {})
    sent = signed("/ledger/version", {"conn_id": CONN}, key="not-the-key")
    assert server.post("/ledger/version", content=nested, headers=sent["headers"]).status_code == 401
    assert parsed == []


def test_rule_a_signed_body_nested_too_deep_answers_400(server):
    sent = signed("/ledger/version", {"conn_id": CONN})
    nested = b"[" * 60_000
    parts = {
        name: sent["headers"][header] for name, header in (("timestamp", signing.TIMESTAMP), ("nonce", signing.NONCE))
    }
    mac = signing.signature(KEY, method="POST", route="/ledger/version", conn_id=CONN, body=nested, **parts)
    sent["headers"][signing.SIGNATURE] = mac
    answer = server.post("/ledger/version", content=nested, headers=sent["headers"])
    assert answer.status_code == 400 and "JSON object" in answer.json()["detail"]


@pytest.mark.parametrize("size", [signing.MAX_BODY_BYTES + 1, 5 * 1024 * 1024])
def test_rule_a_body_over_the_limit_answers_413_and_logs_a_bounded_line(server, size, caplog):
    caplog.set_level(logging.DEBUG)
    huge = {"conn_id": "x" * size}
    answer = server.post("/ledger/version", **signed("/ledger/version", huge, key="not-the-key", conn_id=CONN))
    assert answer.status_code == 413 and str(signing.MAX_BODY_BYTES) in answer.json()["detail"]
    assert len(caplog.text) < 2000


def test_rule_a_connection_id_an_unsigned_caller_names_reaches_the_log_only_as_a_prefix(server, caplog):
    long_name = "gpumarket_" + "n" * 240
    server.post("/ledger/version", **signed("/ledger/version", {"conn_id": long_name}, conn_id=long_name))
    assert "cannot read" in caplog.text and long_name not in caplog.text


def test_rule_a_field_named_with_a_lone_surrogate_answers_400(server):
    answer = server.post("/ledger/version", **signed("/ledger/version", {"conn_id": CONN, "\ud800": float("nan")}))
    assert answer.status_code == 400 and "must be a finite number" in answer.json()["detail"]


def test_rule_a_client_that_leaves_mid_body_gets_400_not_500():
    import asyncio

    from airflow_gpumarket.ui import app as app_module

    sent = signed("/ledger/version", {"conn_id": CONN})
    headers = [(name.lower().encode(), value if isinstance(value, bytes) else value.encode())
               for name, value in sent["headers"].items()]  # fmt: skip
    scope = {"type": "http", "method": "POST", "path": "/ledger/version", "raw_path": b"/ledger/version",
             "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("airflow.test", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
    arrivals = iter([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])
    answered = []

    async def receive():
        return next(arrivals)

    async def send(message):
        answered.append(message)

    asyncio.run(app_module.create_app()(scope, receive, send))
    assert answered[0]["status"] == 400


def test_rule_unsigned_callers_write_one_warning_a_minute_with_a_count(monkeypatch):
    from airflow_gpumarket.ui import verify

    now = [0.0]
    lines = verify._FewLines(clock=lambda: now[0])
    written = []
    monkeypatch.setattr(verify.log, "warning", lambda fmt, *args: written.append(fmt % args))
    for _ in range(3):
        lines.warn("names connection 'x'")
    now[0] = 61.0
    lines.warn("names connection 'y'")
    assert written == [
        "A signed request names connection 'x'",
        "A signed request names connection 'y' (2 more such requests in the last minute)",
    ]


@pytest.mark.parametrize(
    ("route", "module", "name"),
    [
        ("/ledger/entries", "ledger", "entries"),
        ("/ledger/reserve", "ledger", "reserve"),
        ("/hosts/avoided", "host_memory", "avoided"),
        ("/history/learned", "task_history", "learned"),
    ],
)
def test_rule_a_routes_database_work_runs_off_the_event_loop(server, monkeypatch, route, module, name):
    """A lock wait in the metadata database must not hold the api-server's loop (the UI and the execution API's)."""
    import asyncio
    import contextlib
    import importlib

    on_loop = []

    def work(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        raise ledger.BudgetRefused("stop here")

    monkeypatch.setattr(importlib.import_module(f"airflow_gpumarket.{module}"), name, work)
    body = {**valid_bodies(CONN)[route], "dag_id": "fanout"} if route != "/hosts/avoided" else {"conn_id": CONN}
    with contextlib.suppress(ledger.BudgetRefused):  # the test client raises what no route turned into an answer
        server.post(route, **signed(route, body))
    assert on_loop == [False]
