"""Constants and small helpers shared by the unit tests (no Airflow import here: conftest sets Airflow up first)."""

from __future__ import annotations

import json
import logging

BASE_URL = "https://api.example.com"
#: The API key of the test connection. Long and distinctive, so a leak anywhere is found by a plain substring test.
API_KEY = "gmk-live-7f3c9a1b2d4e6f80-secret"
AUTH_HEADER = f"Bearer {API_KEY}"
CONN_ENV = "AIRFLOW_CONN_GPUMARKET_DEFAULT"
HOOK_LOGGER = "tests.unit.gpumarket_hook"
FAST_RETRIES = {"retry_min_wait": 0, "retry_max_wait": 0, "max_retries": 3}


def conn_json(
    host: str | None = BASE_URL, password: str | None = API_KEY, extra: dict | None = None, port: int | None = None
) -> str:
    """The JSON form of a gpumarket connection, as Airflow reads it from ``AIRFLOW_CONN_<ID>``."""
    conn: dict = {"conn_type": "gpumarket"}
    if host is not None:
        conn["host"] = host
    if password is not None:
        conn["password"] = password
    if port is not None:
        conn["port"] = port
    conn["extra"] = dict(FAST_RETRIES) if extra is None else extra
    return json.dumps(conn)


def use_stdlib_logger(hook):
    """Point the hook's ``log`` at a stdlib logger so caplog sees every record, DEBUG included.

    Airflow 3 hooks log through structlog, which bypasses caplog and drops records below INFO.
    """
    hook._log = logging.getLogger(HOOK_LOGGER)
    return hook


def url(path: str) -> str:
    return BASE_URL + path


def methods_and_urls(mocker) -> list[tuple[str, str]]:
    """(method, full URL) of every request requests-mock saw, in order."""
    return [(r.method, r.url) for r in mocker.request_history]


def methods_and_paths(mocker) -> list[tuple[str, str]]:
    """(method, full URL without its query) of every request requests-mock saw, in order."""
    return [(r.method, r.url.split("?")[0]) for r in mocker.request_history]
