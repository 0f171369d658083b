"""GpuMarketSpendReportOperator (operators/spend_report.py) with a fake hook and the budget ledger: the window from the
data interval, the charges and ledger entries it reads, the report it logs and returns, and a service without
charges."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from bad_input import refused_at_parse_time
from sqlalchemy import create_engine

from airflow_gpumarket import ledger
from airflow_gpumarket._compat import AirflowFailException
from airflow_gpumarket.api import Charge
from airflow_gpumarket.exceptions import GpuMarketNotFoundError
from airflow_gpumarket.operators import budget
from airflow_gpumarket.operators.spend_report import LEDGER_LOOKBACK, GpuMarketSpendReportOperator

DAY = 86400
JAN_1 = 1_767_225_600  # 2026-01-01 00:00 UTC
JAN_2 = JAN_1 + DAY
MIDNIGHT = datetime(2026, 1, 1, tzinfo=UTC)

CASES = [
    (GpuMarketSpendReportOperator, {"window_start": "yesterday"}, "window_start"),
    (GpuMarketSpendReportOperator, {"window_start": JAN_2, "window_end": JAN_1}, "window_end"),
    (GpuMarketSpendReportOperator, {"ledger_lookback": -1}, "ledger_lookback"),
]
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def charge(amount: float, instance_id: int | None) -> Charge:
    source = None if instance_id is None else f"instance-{instance_id}"
    return Charge(type="instance" if instance_id else "volume", source=source, instance_id=instance_id,
                  amount=amount, start=JAN_1 + 60, end=JAN_1 + 3660, description="")  # fmt: skip


class Service:
    """A fake hook: the account's charges, and the windows they were asked for."""

    def __init__(self, *charges: Charge, missing: bool = False) -> None:
        self.charges_given = list(charges)
        self.missing = missing
        self.asked: list[tuple[float, float]] = []

    def charges(self, start, end, *, types=None):
        self.asked.append((start, end))
        if self.missing:
            raise GpuMarketNotFoundError(
                "charges: this service has no GET /api/v0/charges/ (HTTP 404).", status_code=404, operation="charges"
            )
        return self.charges_given


class Ledger:
    """The ledger as ``ledger_client`` hands it out, with the reads it was asked for."""

    def __init__(self, *entries: dict) -> None:
        self.rows = list(entries)
        self.asked: list[tuple[str, float]] = []

    def entries(self, conn_id, since):
        self.asked.append((conn_id, since))
        return self.rows


@pytest.fixture
def the_ledger(monkeypatch):
    found = Ledger(
        {"id": 1, "instance_id": 11, "dag_id": "train_llm", "team": "ml", "created_at": JAN_1 - 3 * DAY},
        {"id": 2, "instance_id": 12, "dag_id": "embed", "team": None, "created_at": JAN_1},
    )
    monkeypatch.setattr(budget, "ledger_client", lambda hook: found)
    return found


def reporter(service: Service, **kwargs) -> GpuMarketSpendReportOperator:
    op = GpuMarketSpendReportOperator(task_id="spend_report", **kwargs)
    op.__dict__["hook"] = service  # the cached_property, replaced
    return op


def daily(start: datetime = MIDNIGHT) -> dict:
    """The context's data interval of a daily DAG's run for the day that starts at ``start``."""
    return {"data_interval_start": start, "data_interval_end": start + timedelta(days=1)}


def test_the_window_is_the_runs_data_interval_with_its_last_second_left_to_the_next_window(the_ledger):
    service = Service()
    result = reporter(service).execute(daily())
    assert (result["start"], result["end"]) == (JAN_1, JAN_2)
    assert service.asked == [(JAN_1, JAN_2 - 1)]  # the service's filter includes both ends


def test_without_a_data_interval_the_window_is_the_last_24_hours(the_ledger, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: JAN_2 + 300.0)
    service = Service()
    result = reporter(service).execute({})
    assert (result["start"], result["end"]) == (JAN_1 + 300, JAN_2 + 300)


def test_a_window_given_in_templated_fields_wins(the_ledger):
    assert GpuMarketSpendReportOperator.template_fields == ("window_start", "window_end")
    service = Service()
    op = reporter(service, window_start="{{ data_interval_start }}", window_end="{{ data_interval_end }}")
    op.window_start, op.window_end = "2026-01-01T06:00:00+00:00", "2026-01-01T12:00:00+00:00"  # as rendered
    result = op.execute(daily())
    assert (result["start"], result["end"]) == (JAN_1 + 6 * 3600, JAN_1 + 12 * 3600)


def test_the_ledger_is_read_from_well_before_the_window_so_older_rentals_are_found(the_ledger):
    result = reporter(Service(charge(2.0, 11)), gpumarket_conn_id="team_b").execute(daily())
    assert the_ledger.asked == [("team_b", JAN_1 - LEDGER_LOOKBACK.total_seconds())]
    assert result["per_dag"] == {"train_llm": 2.0} and result["leaked"] == []  # rented three days before


def test_the_report_is_returned_as_json_per_dag_per_team_and_leaked(the_ledger):
    service = Service(charge(1.5, 11), charge(0.25, 12), charge(0.5, 12), charge(3.0, 404), charge(0.1, None))
    result = reporter(service).execute(daily())
    assert json.loads(json.dumps(result)) == result
    assert result["per_dag"] == {"train_llm": 1.5, "embed": 0.75}
    assert result["per_team"] == {"ml": 1.5, "(no team)": 0.75}
    assert result["leaked"] == [{"instance_id": 404, "amount": 3.0, "days": ["2026-01-01"]}]
    assert result["other"] == {"volume": 0.1} and result["total"] == 5.35


def test_the_table_is_logged_and_leaked_looking_charges_are_warned_about(the_ledger, task_log):
    reporter(Service(charge(1.5, 11), charge(3.0, 404))).execute(daily())
    log = task_log()
    assert "GPU Market spend from 2026-01-01 00:00 UTC to 2026-01-02 00:00 UTC: 2 charges" in log
    assert "Total charged" in log and "4.5000" in log
    assert "1 instance(s) were charged $3.0000 that no task recorded renting: 404" in log


def test_a_service_without_charges_fails_the_task_saying_so_without_retrying(the_ledger):
    with pytest.raises(AirflowFailException, match="needs the account's charges.*no GET /api/v0/charges/"):
        reporter(Service(missing=True)).execute(daily())
    assert the_ledger.asked == []


def test_rentals_the_ledger_recorded_are_attributed_end_to_end(tmp_path, monkeypatch):
    """The ledger's own rows (reserved, then attached to the instance the create made) drive the attribution."""
    engine = create_engine(f"sqlite:///{tmp_path}/airflow.db")
    monkeypatch.setattr(budget, "ledger_client", lambda hook: budget._Direct(engine))
    for row, (dag_id, team, instance_id) in enumerate([("train_llm", "ml", 11), ("embed", None, 12)]):
        request = ledger.Request(conn_id="gpumarket_default", dag_id=dag_id, run_id="r", task_id="t", map_index=row,
                                 try_number=1, worst=5.0, seconds=3600, hourly=1.0, team=team)  # fmt: skip
        ledger.attach(engine, "gpumarket_default", ledger.reserve(engine, request, now=JAN_1 - 60).id, instance_id)
    try:
        result = reporter(Service(charge(1.25, 11), charge(0.75, 12), charge(2.0, 13))).execute(daily())
    finally:
        engine.dispose()
    assert result["per_dag"] == {"train_llm": 1.25, "embed": 0.75}
    assert result["per_team"] == {"ml": 1.25, "(no team)": 0.75}
    assert [leak["instance_id"] for leak in result["leaked"]] == [13]
