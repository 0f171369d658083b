"""The plugin's app under test, shared by the route tests of this folder."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine

from .test_ledger_api import CONN, KEY


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A test client of the plugin's app whose ledger is a fresh database; the connection's key is ``KEY``, and DAG
    ``fanout`` may spend $1 a day."""
    from fastapi.testclient import TestClient

    from airflow_gpumarket.ui import app as app_module
    from airflow_gpumarket.ui import verify

    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(verify, "metadata_engine", lambda: engine)
    monkeypatch.setattr(verify, "UNSIGNED_FLOOR_SECONDS", 0.0)  # test_signed_routes.py shows the floor
    monkeypatch.setattr(verify, "_unreadable", verify._FewLines())  # each test sees its first warning
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "gpumarket", "host": "http://127.0.0.1:9", "password": KEY}),
    )
    monkeypatch.setenv("AIRFLOW_VAR_GPUMARKET_BUDGETS", json.dumps({"fanout": {"day": 1.0}}))
    client = TestClient(app_module.create_app(), base_url="http://airflow.test")
    client.engine = engine
    return client
