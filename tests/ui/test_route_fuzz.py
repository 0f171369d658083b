"""Every signed route of the provider's app, fuzzed in-process (route_fuzz.py): no 5xx, no route confusion, and
nothing written by a refused request."""

from __future__ import annotations

import json

import pytest

from airflow_gpumarket._compat import is_airflow_2

from .route_fuzz import ROUTES, Sent, Target, check, edge_requests, fuzz

pytestmark = pytest.mark.skipif(is_airflow_2(), reason="the routes are an Airflow 3.1+ api-server plugin")

KEY = "fuzz-key"
CONN = "gpumarket_fuzz"
HTTP_CONN = "http_fuzz"
#: Examples per route: ten routes, about two seconds each.
EXAMPLES = 150


@pytest.fixture
def target(airflow_db, monkeypatch) -> Target:
    """The plugin's app on the test run's metadata database (the history route reads its task instances)."""
    from airflow import settings
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui import verify

    monkeypatch.setattr(verify, "UNSIGNED_FLOOR_SECONDS", 0.0)  # hundreds of unsigned requests
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    monkeypatch.setenv(f"AIRFLOW_CONN_{HTTP_CONN.upper()}", json.dumps({"conn_type": "http", "password": KEY}))
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"fuzzed": {"day": 1.0}}))
    app = TestClient(app_module.create_app(), base_url="http://airflow.test")

    def post(sent: Sent) -> int:
        return app.post(sent.route, content=sent.content, headers=sent.headers).status_code

    return Target(post, settings.engine, CONN, KEY)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("other_conn", [HTTP_CONN, "gpumarket_nowhere"])
def test_rule_no_request_answers_500_and_a_refused_one_writes_nothing(target, route, other_conn):
    seen = fuzz(target, route, other_conn_id=other_conn, examples=EXAMPLES // 2)
    assert 401 in seen and 400 in seen, seen  # the generator reaches both the signature's check and the fields'


@pytest.mark.parametrize("route", ROUTES)
def test_rule_each_field_of_each_route_refuses_each_edge_value_with_a_4xx_at_most(target, route):
    statuses = {check(target, sent) for sent in edge_requests(route, key=KEY, conn_id=CONN)}
    assert 400 in statuses, statuses
