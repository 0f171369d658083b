"""Every signed route of the provider's app, fuzzed in-process (route_fuzz.py): no 5xx, no route confusion, and
nothing written by a refused request."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket._compat import is_airflow_2

from .route_fuzz import ROUTES, Sent, check, edge_requests, fuzz

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

KEY = "fuzz-key"
CONN = "gpumarket_fuzz"
HTTP_CONN = "http_fuzz"
#: Examples per route: ten routes, about two seconds each.
EXAMPLES = 150


@pytest.fixture
def app(airflow_db, monkeypatch):
    """The plugin's app on the test run's metadata database (the history route reads its task instances)."""
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    monkeypatch.setenv(f"AIRFLOW_CONN_{HTTP_CONN.upper()}", json.dumps({"conn_type": "http", "password": KEY}))
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"fuzzed": {"day": 1.0}}))
    return TestClient(app_module.create_app(), base_url="http://airflow.test")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("other_conn", [HTTP_CONN, "gpumarket_nowhere"])
def test_rule_no_request_answers_500_and_a_refused_one_writes_nothing(app, route, other_conn):
    from airflow import settings

    def post(sent: Sent) -> int:
        return app.post(sent.route, content=sent.content, headers=sent.headers).status_code

    examples = EXAMPLES // 2
    seen = fuzz(post, settings.engine, route, key=KEY, conn_id=CONN, other_conn_id=other_conn, examples=examples)
    assert 401 in seen and 400 in seen, seen  # the generator reaches both the signature's check and the fields'


@pytest.mark.parametrize("route", ROUTES)
def test_rule_each_field_of_each_route_refuses_each_edge_value_with_a_4xx_at_most(app, route):
    from airflow import settings

    def post(sent: Sent) -> int:
        return app.post(sent.route, content=sent.content, headers=sent.headers).status_code

    statuses = {check(post, settings.engine, sent) for sent in edge_requests(route, key=KEY, conn_id=CONN)}
    assert 400 in statuses, statuses
