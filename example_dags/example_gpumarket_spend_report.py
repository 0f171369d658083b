"""Every day: yesterday's GPU spend per DAG and per team, charges that no task recorded, and a watch on the credit.

``spend_report`` reads what the service charged over the run's data interval (the day before, for this daily DAG)
and the budget ledger's entries, logs the report as a table and returns it (XCom). ``watch_credit`` reads the
account's credit every hour of the day, holding no worker slot in between, and succeeds as soon as the credit is at
or below ``credit_threshold`` dollars or lasts fewer than ``runway_days`` days at the last 7 days' burn: its
``on_success_callback`` is the alert. A day the credit stays healthy ends with the watch skipped.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.common.compat.sdk import DAG, BaseNotifier

from airflow_gpumarket.operators.spend_report import GpuMarketSpendReportOperator
from airflow_gpumarket.sensors.credit import GpuMarketCreditSensor


class TaskLogNotifier(BaseNotifier):
    """Stands in for your notifier (``SlackNotifier``, ``SmtpNotifier``, ...): writes its message to the task log."""

    template_fields = ("message",)

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def notify(self, context: Any) -> None:
        self.log.warning("%s", self.message)


with DAG(
    dag_id="example_gpumarket_spend_report",
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    params={"credit_threshold": 25.0, "runway_days": 3},  # dollars; days (None: no runway check)
    tags=["gpumarket", "example", "maintenance"],
) as dag:
    GpuMarketSpendReportOperator(task_id="spend_report")

    GpuMarketCreditSensor(
        task_id="watch_credit",
        threshold="{{ params.credit_threshold }}",
        runway_days="{{ params.runway_days }}",
        mode="reschedule",
        poke_interval=timedelta(hours=1),
        timeout=timedelta(hours=23),  # then the next day's run watches
        soft_fail=True,  # a day without low credit ends skipped, not failed
        on_success_callback=TaskLogNotifier(
            "GPU Market credit is low: ${{ ti.xcom_pull(task_ids='watch_credit')['available'] }} left"
        ),
    )
