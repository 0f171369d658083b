"""Operator tests talk to https://api.example.com through requests-mock, with instant retries."""

from __future__ import annotations

import json

import pytest

BASE = "https://api.example.com"
KEY = "op-test-key-0123456789"


@pytest.fixture(autouse=True)
def gpumarket_connection(monkeypatch):
    conn = {
        "conn_type": "gpumarket",
        "host": BASE,
        "password": KEY,
        "extra": {"retry_min_wait": 0, "retry_max_wait": 0},
    }
    monkeypatch.setenv("AIRFLOW_CONN_GPUMARKET_DEFAULT", json.dumps(conn))
