"""Run when the market is right: a DAG scheduled by an offer watcher, and by 06:00 UTC in any case (Airflow 3).

The watcher searches the market every 5 minutes for an 8x H100 host at $20/h or less with a reliability of 0.98 or
more, and fires once each time such offers appear (not once per search). The DAG runs on that event, or at 06:00
UTC when none came by then. Its task rents with the same filters and cap, so it takes the offer that appeared or,
when someone rented it meanwhile, the next one that matches; when none does, it waits for one, then pays more. A
rental whose worst case is above $90 waits for a person's approval in the Airflow UI first (Airflow 3.1+).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.common.compat.sdk import DAG

from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator

try:
    from airflow.sdk import Asset, AssetWatcher
    from airflow.timetables.assets import AssetOrTimeSchedule
    from airflow.timetables.trigger import CronTriggerTimetable
except ImportError:  # Airflow 2.11 has no event-driven scheduling: the DAG runs at 06:00 only
    AssetWatcher = None

try:  # human-in-the-loop approvals: Airflow 3.1 and later
    from airflow.providers.standard.operators.hitl import HITLOperator  # noqa: F401
except ImportError:
    HUMAN_IN_THE_LOOP = False
else:
    HUMAN_IN_THE_LOOP = True

FILTERS = {"gpu_name": {"eq": "H100 SXM"}, "num_gpus": {"eq": 8}, "reliability": {"gte": 0.98}}
MAX_DPH = 20.0
#: A rental whose worst case (4 hours at the price) is above this is approved by a person in the UI first.
APPROVAL_ABOVE = 90.0 if HUMAN_IN_THE_LOOP else None
schedule: object = "0 6 * * *"

if AssetWatcher is not None:
    from airflow_gpumarket.triggers.offers import GpuMarketOfferTrigger

    h100_hosts = Asset(
        "gpumarket-offers-8x-h100",
        watchers=[
            AssetWatcher(
                name="8x_h100_at_20_per_hour",
                trigger=GpuMarketOfferTrigger(offer_filters=FILTERS, max_dph=MAX_DPH, poll_interval=300),
            )
        ],
    )
    schedule = AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 6 * * *", timezone="UTC"), assets=h100_hosts)

with DAG(
    dag_id="example_gpumarket_market_schedule",
    start_date=datetime(2026, 1, 1),
    schedule=schedule,
    catchup=False,
    tags=["gpumarket", "example"],
):
    GpuMarketRunJobOperator(
        task_id="train",
        offer_filters=FILTERS,
        max_dph=MAX_DPH,
        image="pytorch/pytorch:latest",
        command="python train.py",
        max_runtime=timedelta(hours=4),
        deferrable=True,
        # When the offer is gone by the time the task searches and none other matches: wait for one in the
        # triggerer for up to an hour, then rent on demand anyway at up to $30/h.
        wait_for_offer=timedelta(hours=1),
        on_no_offer="rent_on_demand",
        fallback_max_dph=30.0,
        approval_above=APPROVAL_ABOVE,
    )
