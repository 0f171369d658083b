"""Trigger tests read through fake async hooks; the shared poller may round as fast as they poll."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fast_list_budget(monkeypatch):
    """The shared poller rounds no faster than the live list budget (0.5/s); these tests poll every 0 s."""
    monkeypatch.setattr("airflow_gpumarket.api.retry.LIST_RATE_PER_SECOND", 1000.0)
