"""The spend report as pure rules (spend_report.py): charges attributed through the ledger to DAGs and teams, charges
no task recorded, exact sums, the table and the XCom dict, and the window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from airflow_gpumarket import spend_report
from airflow_gpumarket.api import Charge
from airflow_gpumarket.exceptions import GpuMarketValidationError

DAY = 86400
JAN_1 = 1_767_225_600  # 2026-01-01 00:00 UTC
JAN_2 = JAN_1 + DAY


def charge(
    amount: float, instance_id: int | None = None, *, at: float = JAN_1 + 3600, kind: str = "instance"
) -> Charge:
    source = f"instance-{instance_id}" if instance_id is not None else f"{kind}-7"
    return Charge(type=kind, source=source, instance_id=instance_id, amount=amount, start=at, end=at + 3600,
                  description="")  # fmt: skip


def entry(instance_id: int | None, dag_id: str, team: str | None = None, *, row: int = 1, created_at=JAN_1) -> dict:
    """A ledger row as ``ledger.entries`` hands it out (only the fields the report reads, and a few it ignores)."""
    return {"id": row, "conn_id": "gpumarket_default", "dag_id": dag_id, "run_id": "r", "task_id": "t",
            "map_index": -1, "team": team, "instance_id": instance_id, "reserved": 9.0, "cost": None,
            "created_at": created_at}  # fmt: skip


LEDGER = [entry(1, "train_llm", "ml", row=1), entry(2, "train_llm", "ml", row=2), entry(3, "embed", None, row=3)]


def report(charges, entries=LEDGER, start=JAN_1, end=JAN_2) -> spend_report.SpendReport:
    return spend_report.build(charges, entries, start=start, end=end)


# --- Attribution --------------------------------------------------------------------------------------------------
def test_each_instance_charge_counts_for_the_dag_whose_ledger_entry_names_the_instance():
    built = report([charge(1.25, 1), charge(0.5, 2), charge(0.75, 3)])
    assert built.per_dag == {"train_llm": Decimal("1.75"), "embed": Decimal("0.75")}


def test_each_instance_charge_counts_for_the_team_of_its_dag_and_no_team_tag_is_no_team():
    built = report([charge(1.25, 1), charge(0.5, 2), charge(0.75, 3)])
    assert built.per_team == {"ml": Decimal("1.75"), spend_report.NO_TEAM: Decimal("0.75")}
    assert spend_report.NO_TEAM == "(no team)"


def test_sums_are_exact_to_the_cent_where_floats_would_drift():
    # 0.1 + 0.2 is 0.30000000000000004 in floats; a thousand charges of 0.01 are 10.000000000000002.
    built = report([charge(0.1, 1), charge(0.2, 1), *[charge(0.01, 3) for _ in range(1000)]])
    assert built.per_dag == {"embed": Decimal("10.00"), "train_llm": Decimal("0.3")}
    assert built.total == Decimal("10.3")
    assert built.to_dict()["per_dag"] == {"embed": 10.0, "train_llm": 0.3}


def test_only_a_charges_own_amount_counts_not_its_breakdown_again():
    items = (charge(1.5, 1), charge(0.25, None, kind="storage"))
    whole = Charge(type="instance", source="instance-1", instance_id=1, amount=1.75, start=JAN_1, end=JAN_1 + 60,
                   description="", items=items)  # fmt: skip
    assert report([whole]).total == Decimal("1.75")


def test_an_instance_named_by_several_entries_counts_for_the_latest():
    entries = [entry(5, "old_dag", "a", row=1, created_at=JAN_1 - DAY), entry(5, "new_dag", "b", row=2)]
    assert report([charge(2.0, 5)], entries).per_dag == {"new_dag": Decimal("2.0")}


def test_a_reservation_whose_create_made_nothing_names_no_instance():
    built = report([charge(2.0, 8)], [entry(None, "d", row=1)])
    assert built.per_dag == {} and [leak.instance_id for leak in built.leaked] == [8]


# --- Leaked-looking charges ---------------------------------------------------------------------------------------
def test_charges_of_instances_no_ledger_entry_names_are_leaked_looking_with_their_amount_and_days():
    built = report([charge(1.0, 1), charge(2.5, 99, at=JAN_1 + 60), charge(0.5, 99, at=JAN_2 - 60), charge(3.0, 42)])
    assert [(leak.instance_id, leak.amount, leak.days) for leak in built.leaked] == [
        (42, Decimal("3.0"), ("2026-01-01",)),  # the largest first
        (99, Decimal("3.0"), ("2026-01-01",)),
    ]
    assert built.leaked_total == Decimal("6.0") and built.per_dag == {"train_llm": Decimal("1.0")}


def test_a_leaked_looking_instance_lists_every_day_it_was_charged_on():
    built = report([charge(1.0, 99, at=JAN_1 + 60), charge(1.0, 99, at=JAN_2 + 60)], end=JAN_2 + DAY)
    assert built.leaked[0].days == ("2026-01-01", "2026-01-02")


def test_charges_of_no_instance_are_listed_by_type_not_as_leaks():
    built = report(
        [charge(0.5, None, kind="volume"), charge(0.25, None, kind="volume"), charge(1, None, kind="serverless")]
    )
    assert built.leaked == () and built.per_dag == {}
    assert built.other == {"serverless": Decimal("1"), "volume": Decimal("0.75")}


def test_the_total_is_every_charge_recorded_leaked_or_other():
    built = report([charge(1.1, 1), charge(2.2, 77), charge(3.3, None, kind="volume")])
    assert built.total == built.recorded + built.leaked_total + built.other_total == Decimal("6.6")
    assert built.charges == 3


# --- What it hands out --------------------------------------------------------------------------------------------
def test_the_xcom_dict_is_plain_json_with_money_rounded_to_four_places():
    built = report([charge(1.23456, 1), charge(0.00005, 99), charge(2, None, kind="volume")])
    value = built.to_dict()
    assert json.loads(json.dumps(value)) == value
    assert value == {
        "start": JAN_1,
        "end": JAN_2,
        "charges": 3,
        "total": 3.2346,
        "recorded": 1.2346,
        "per_dag": {"train_llm": 1.2346},
        "per_team": {"ml": 1.2346},
        "leaked": [{"instance_id": 99, "amount": 0.0001, "days": ["2026-01-01"]}],
        "leaked_total": 0.0001,
        "other": {"volume": 2.0},
        "other_total": 2.0,
    }


def test_the_table_has_fixed_width_columns_money_to_four_places_and_a_totals_line():
    table = report([charge(1234.5, 1), charge(0.1, 3), charge(2, 99), charge(0.25, None, kind="volume")]).table()
    lines = table.splitlines()
    assert lines[0] == "GPU Market spend from 2026-01-01 00:00 UTC to 2026-01-02 00:00 UTC: 4 charges"
    money = [line for line in lines if line[:1].strip() and line.rstrip()[-1:].isdigit() and "." in line]
    ends = {len(line.split("   2026")[0].rstrip()) for line in money}
    assert len(ends) == 1, "every amount ends in the same column"
    assert "train_llm                   1,234.5000" in lines  # the name column is as wide as its widest name
    assert "(no team)                       0.1000" in lines
    assert "instance 99                     2.0000   2026-01-01" in lines
    assert "volume                          0.2500" in lines
    assert lines[-1] == "Total charged               1,236.8500"
    assert lines[-2] == "=" * len(lines[-1])


def test_the_table_of_a_window_without_charges_says_none_and_totals_zero():
    table = report([]).table()
    assert "(none)" in table and table.splitlines()[-1].endswith("0.0000")
    assert "Leaked-looking" not in table


# --- Money and time, read ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("amount", "exact"), [(0.1, "0.1"), (1.875, "1.875"), (3, "3"), ("2.50", "2.50"), (Decimal("7"), "7")]
)
def test_an_amount_becomes_the_decimal_it_was_written_as(amount, exact):
    assert spend_report.dollars(amount) == Decimal(exact)


def test_money_is_rounded_half_up_to_four_places_only_when_shown():
    assert spend_report.rounded(Decimal("0.00005")) == Decimal("0.0001")
    assert spend_report.rounded(Decimal("2.44444")) == Decimal("2.4444")


WHEN = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [WHEN, WHEN.replace(tzinfo=None), "2026-01-01T00:00:00+00:00", "2026-01-01 00:00:00+00:00", JAN_1, str(JAN_1)],
)
def test_a_moment_is_a_datetime_iso_text_or_epoch_seconds(value):
    assert spend_report.epoch_seconds("window_start", value) == JAN_1


@pytest.mark.parametrize("value", ["yesterday", "inf", float("nan"), True, [JAN_1]])
def test_a_moment_that_is_none_of_those_is_refused_naming_the_argument(value):
    with pytest.raises(GpuMarketValidationError, match="window_end"):
        spend_report.epoch_seconds("window_end", value)


def test_the_window_is_the_data_interval_by_default():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert spend_report.window(None, None, interval_start=start, interval_end=start + timedelta(days=1), now=0) == (
        JAN_1,
        JAN_2,
    )


@pytest.mark.parametrize("interval", [(None, None), (JAN_1, JAN_1)], ids=["no data interval", "an empty one"])
def test_the_window_without_a_data_interval_is_the_last_day(interval):
    now = JAN_2 + 123
    assert spend_report.window(None, None, interval_start=interval[0], interval_end=interval[1], now=now) == (
        now - DAY,
        now,
    )


def test_a_window_given_wins_over_the_data_interval():
    got = spend_report.window("2026-01-01T06:00:00+00:00", None, interval_start=JAN_1, interval_end=JAN_2, now=0)
    assert got == (JAN_1 + 6 * 3600, JAN_2)


def test_a_window_that_ends_before_it_starts_is_refused():
    with pytest.raises(GpuMarketValidationError, match="window_end: must be after window_start"):
        spend_report.window(JAN_2, JAN_1, now=0)
