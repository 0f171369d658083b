"""The offer watcher's trigger (triggers/offers.py) on each Airflow: its row, and what 2.11 says of it."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger

AIRFLOW_2 = version("apache-airflow").startswith("2.")
WATCH = {"offer_filters": {"gpu_name": {"eq": "H100 SXM"}}, "max_dph": 20.0, "min_reliability": 0.98}


@pytest.mark.skipif(not AIRFLOW_2, reason="Airflow 2.11 only")
def test_rule_on_airflow_2_the_watcher_says_it_needs_airflow_3():
    with pytest.raises(GpuMarketValidationError, match="needs Airflow 3.0 or later"):
        GpuMarketOfferTrigger(**WATCH)


@pytest.mark.skipif(AIRFLOW_2, reason="AssetWatcher triggers are Airflow 3's")
def test_a_watcher_rebuilt_from_its_row_watches_the_same_and_shares_the_same_search():
    from airflow.triggers.base import BaseEventTrigger

    trigger = GpuMarketOfferTrigger(**WATCH)
    path, kwargs = trigger.serialize()
    again = GpuMarketOfferTrigger(**kwargs)
    assert isinstance(trigger, BaseEventTrigger) and path.endswith("triggers.offers.GpuMarketOfferTrigger")
    assert again.watch == trigger.watch and again.shared_stream_key() == trigger.shared_stream_key()
    other = GpuMarketOfferTrigger(**{**WATCH, "offer_filters": {"gpu_name": {"eq": "A100"}}})
    assert other.shared_stream_key() != trigger.shared_stream_key()
    with pytest.raises(GpuMarketValidationError, match="poll_interval"):
        GpuMarketOfferTrigger(**WATCH, poll_interval=0)
