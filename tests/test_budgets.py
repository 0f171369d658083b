"""The budgets' pure rules: the Variable's shape, the worst case, the windows and the refusal."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_gpumarket import budgets

NOON = dt.datetime(2026, 11, 25, 12, tzinfo=dt.timezone.utc).timestamp()  # a Wednesday  # noqa: UP017


def test_budgets_are_set_per_dag_with_a_default_for_every_other_dag():
    raw = '{"train": {"day": 1, "run": 0.25}, "*": {"month": 50}}'
    assert budgets.limits_of(raw, "train") == (budgets.Limits(day=1.0, run=0.25), [])
    assert budgets.limits_of(raw, "other") == (budgets.Limits(month=50.0), [])
    assert budgets.limits_of(None, "train") == (None, [])


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"train": 5}', "gpumarket_budgets['train'] must be an object"),
        ('{"train": {"daily": 5}}', "unknown key(s) 'daily'"),
        ('{"train": {"day": -1}}', "gpumarket_budgets['train'].day must be a number of dollars >= 0"),
        ('{"train": {"day": "5"}}', "gpumarket_budgets['train'].day must be a number"),
        ('{"*": {"day": "5"}}', "gpumarket_budgets['*'].day must be a number"),  # the default it falls back to
    ],
)
def test_a_malformed_budgets_variable_names_the_key_and_the_fix(raw, named):
    with pytest.raises(budgets.BudgetConfigError, match=None) as caught:
        budgets.limits_of(raw, "train")
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "limits", "skipped"),
    [
        ('{"train": {"day": 1}, "other": {"day": "5"}}', budgets.Limits(day=1.0), "gpumarket_budgets['other']"),
        ('{"train": {"day": 1}, "*": {"dya": 5}}', budgets.Limits(day=1.0), "gpumarket_budgets['*']"),
        ('{"other": {"day": "5"}, "*": {"week": 7}}', budgets.Limits(week=7.0), "gpumarket_budgets['other']"),
        ('{"other": 3}', None, "gpumarket_budgets['other']"),
    ],
)
def test_a_malformed_entry_for_another_dag_is_skipped_with_one_warning_naming_it(raw, limits, skipped):
    found, warnings = budgets.limits_of(raw, "train")
    assert found == limits
    (warning,) = warnings
    assert warning.startswith(skipped) and "does not apply to DAG 'train'" in warning


def test_the_worst_case_is_the_price_over_the_whole_lease_plus_the_disk():
    worst = budgets.worst_case(hourly_price=0.5, seconds=3600, disk_gb=73, storage_price_per_gb_month=0.1)
    assert worst.amount == pytest.approx(0.5 + 73 * 0.1 / 720, abs=1e-4)
    assert worst.amount >= 0.5 + 73 * 0.1 / 720  # rounded up, never down


def test_a_month_of_disk_is_thirty_days_in_the_provider_and_the_simulator():
    from airflow_gpumarket import api
    from gpumarket_simulator.world import SECONDS_PER_MONTH

    assert api.STORAGE_MONTH_HOURS == 720
    assert api.STORAGE_MONTH_HOURS * 3600 == SECONDS_PER_MONTH
    assert budgets.storage_hourly(720, 0.1) == pytest.approx(0.1)


def test_max_cost_caps_the_worst_case_with_one_poll_of_overshoot():
    worst = budgets.worst_case(hourly_price=3.6, seconds=6 * 3600, max_cost=1.0, overshoot_seconds=10)
    assert worst.amount == pytest.approx(1.01)
    assert worst.capped_by_max_cost
    assert "capped by max_cost" in worst.describe()


def test_windows_are_the_utc_day_iso_week_and_calendar_month():
    starts = budgets.window_starts(NOON)
    as_dates = {k: dt.datetime.fromtimestamp(v, dt.timezone.utc).date().isoformat() for k, v in starts.items()}  # noqa: UP017
    assert as_dates == {"day": "2026-11-25", "week": "2026-11-23", "month": "2026-11-01"}


def test_spend_counts_settled_costs_and_open_reservations_in_each_window():
    entries = [
        budgets.Entry("train", "r1", NOON - 3600, 0.30, open=False),
        budgets.Entry("train", "r2", NOON - 2 * 86400, 0.20, open=True),  # Monday: this week, not today
        budgets.Entry("train", "r0", NOON - 30 * 86400, 5.0, open=False),  # last month
        budgets.Entry("other", "r1", NOON, 9.0, open=True),
    ]
    assert budgets.used(entries, dag_id="train", run_id="r1", now=NOON) == {
        "run": 0.3,
        "day": 0.3,
        "week": 0.5,
        "month": 0.5,
    }


def test_a_rental_over_a_budget_is_refused_naming_the_budget_the_spend_and_the_worst_case():
    why = budgets.refusal(budgets.Limits(day=1.0), {"day": 0.95}, 0.10, dag_id="train")
    assert why is not None
    for part in (
        "day budget of DAG 'train' is $1.00",
        "$0.9500 is spent or reserved today",
        "$0.1000",
        "Nothing was rented",
    ):
        assert part in why
    assert budgets.refusal(budgets.Limits(day=1.0), {"day": 0.90}, 0.10, dag_id="train") is None


def test_a_rental_that_would_overdraw_the_account_is_refused():
    why = budgets.refusal(None, {}, 0.5, dag_id="train", available=1.0, held=0.6)
    assert why is not None and "credit is $1.00" in why and "stop at $0" in why
    assert budgets.refusal(None, {}, 0.4, dag_id="train", available=1.0, held=0.6) is None


def test_held_counts_open_reservations_of_the_connection_until_their_lease_ends():
    entries = [
        budgets.Entry("a", "r", 0, 1.0, open=True, conn_id="c", until=NOON + 1),
        budgets.Entry("a", "r", 0, 2.0, open=True, conn_id="c", until=NOON - 1),  # its rental can bill no more
        budgets.Entry("a", "r", 0, 4.0, open=False, conn_id="c", until=NOON + 1),
        budgets.Entry("a", "r", 0, 8.0, open=True, conn_id="other", until=NOON + 1),
    ]
    assert budgets.held(entries, conn_id="c", now=NOON) == 1.0


@pytest.mark.parametrize("price", [0, 0.0, None, -1.0, float("nan"), "0.3"])
def test_a_worst_case_without_a_known_price_is_refused_rather_than_reserved_at_zero(price):
    with pytest.raises(ValueError, match=r"needs its price in \$/h, above \$0"):
        budgets.worst_case(hourly_price=price, seconds=3600)


def test_rule_a_rentals_estimate_bills_compute_while_it_ran_and_its_disk_from_creation_to_end():
    # Created at 0, first seen running at 600, stopped at 4200, destroyed at 7200: 1 h of compute, 2 h of disk.
    marks = {"created_at": 0.0, "running_at": 600.0, "stopped_at": 4200.0, "ended_at": 7200.0}
    assert budgets.rental_cost(0.5, **marks, disk_hourly=0.1) == pytest.approx(0.7)
    assert budgets.rental_cost(0.5, **{**marks, "running_at": None}) == pytest.approx(0.5 * 4200 / 3600, abs=1e-6)
    assert budgets.rental_cost(None, **marks) is None
