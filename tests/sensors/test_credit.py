"""GpuMarketCreditSensor (sensors/credit.py) and the credit rules it decides with (credit.py), with a fake hook: the
threshold, the runway at the last 7 days' burn, the figures it returns, and a service without the account's money."""

from __future__ import annotations

import math
import time

import pytest
from bad_input import refused_at_parse_time

from airflow_gpumarket import credit
from airflow_gpumarket._compat import AirflowFailException
from airflow_gpumarket.api import Account, Charge
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError
from airflow_gpumarket.sensors.credit import GpuMarketCreditSensor

DAY = 86400
NOW = 1_767_225_600.0

CASES = [
    (GpuMarketCreditSensor, {"threshold": -1}, "threshold"),
    (GpuMarketCreditSensor, {"threshold": "lots"}, "threshold"),
    (GpuMarketCreditSensor, {"threshold": True}, "threshold"),
    (GpuMarketCreditSensor, {"threshold": 10, "runway_days": 0}, "runway_days"),
    (GpuMarketCreditSensor, {"threshold": 10, "poke_interval": 0}, "poke_interval"),
]
test_bad_input_is_refused_at_parse_time_naming_the_argument = refused_at_parse_time(CASES)


def spent(*amounts: float) -> list[Charge]:
    return [Charge(type="instance", source="instance-1", instance_id=1, amount=amount, start=NOW - DAY, end=NOW,
                   description="") for amount in amounts]  # fmt: skip


class Account_:
    """A fake hook: the account's credit (or balance), its charges, and what was read."""

    def __init__(self, credit_left: float | None, *charges: Charge, balance: float | None = None, missing=False):
        self.account_given = Account(credit=credit_left, balance=balance, user_id=1, email=None, username=None)
        self.charges_given = list(charges)
        self.missing = missing
        self.charges_asked: list[tuple[float, float]] = []

    def service_now(self):
        return NOW

    def account(self):
        if self.missing:
            raise GpuMarketNotFoundError("account: this service has no GET /api/v0/users/current (HTTP 404).",
                                         status_code=404)  # fmt: skip
        return self.account_given

    def charges(self, start, end, *, types=None):
        self.charges_asked.append((start, end))
        return self.charges_given


def sensor(hook: Account_, **kwargs) -> GpuMarketCreditSensor:
    op = GpuMarketCreditSensor(task_id="watch_credit", **kwargs)
    op.__dict__["hook"] = hook  # the cached_property, replaced
    return op


# --- The threshold ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("credit_left", "low"), [(24.99, True), (25.0, True), (25.01, False), (0.0, True)])
def test_the_sensor_succeeds_when_the_credit_is_at_or_below_the_threshold(credit_left, low):
    result = sensor(Account_(credit_left), threshold=25).poke({})
    assert result.is_done is low


def test_the_balance_stands_in_for_a_credit_the_service_does_not_send():
    assert sensor(Account_(None, balance=5.0), threshold=25).poke({}).is_done


def test_a_low_credit_returns_its_figures_for_the_notifier():
    result = sensor(Account_(12.5), threshold=25).poke({})
    assert result.xcom_value == {"available": 12.5, "threshold": 25.0, "burn_per_day": None, "runway_days": None,
                                 "min_runway_days": None, "low": True}  # fmt: skip


def test_a_threshold_rendered_from_a_template_is_read_as_a_number():
    op = sensor(Account_(30.0), threshold="{{ params.credit_threshold }}")
    assert GpuMarketCreditSensor.template_fields == ("threshold", "runway_days")
    op.threshold = "50"  # as rendered
    assert op.poke({}).is_done


def test_without_runway_days_no_charges_are_read():
    hook = Account_(100.0)
    sensor(hook, threshold=25).poke({})
    assert hook.charges_asked == []


def test_the_low_credit_is_logged_as_a_warning_and_a_healthy_one_as_information(task_log):
    sensor(Account_(10.0), threshold=25).poke({})
    sensor(Account_(99.0), threshold=25).poke({})
    log = task_log()
    assert "The account's credit is $10.00: at or below the threshold of $25.00" in log
    assert "The account's credit is $99.00: above the threshold of $25.00" in log


# --- The runway ---------------------------------------------------------------------------------------------------
def test_the_runway_is_the_credit_over_the_average_daily_burn_of_the_last_7_days(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)
    hook = Account_(70.0, *spent(40.0, 60.0, 40.0))  # $140 over 7 days: $20 a day, so $70 lasts 3.5 days
    result = sensor(hook, threshold=10, runway_days=4).poke({})
    assert hook.charges_asked == [credit.burn_window(NOW)]  # the 7 full UTC days before the service's today
    assert result.is_done and result.xcom_value["burn_per_day"] == 20.0 and result.xcom_value["runway_days"] == 3.5


def test_a_runway_at_or_beyond_the_days_asked_for_is_not_low():
    assert not sensor(Account_(70.0, *spent(140.0)), threshold=10, runway_days=3.5).poke({}).is_done
    assert not sensor(Account_(70.0, *spent(140.0)), threshold=10, runway_days=3).poke({}).is_done


def test_the_threshold_alone_makes_the_credit_low_whatever_the_runway():
    assert sensor(Account_(9.0), threshold=10, runway_days=3).poke({}).is_done  # no burn: an endless runway


def test_the_burn_is_summed_exactly_before_it_is_divided():
    assert credit.burn_per_day(spent(*[0.1] * 70), NOW) == 1.0  # 70 x 0.1 in floats is 7.000000000000001


@pytest.mark.parametrize(
    ("available", "burn", "days"), [(70.0, 20.0, 3.5), (10.0, 0.0, math.inf), (0.0, 5.0, 0.0), (-3.0, 0.0, 0.0)]
)
def test_the_runway_is_endless_without_burn_and_zero_without_credit(available, burn, days):
    assert credit.runway(available, burn) == days


def test_an_endless_runway_is_none_in_the_figures():
    check = credit.assess(50.0, threshold=10, min_runway_days=3, charges=[], service_now=NOW)
    assert not check.low and check.runway_days == math.inf and check.to_dict()["runway_days"] is None
    assert check.describe() == (
        "The account's credit is $50.00, nothing charged in the 7 full UTC days before today: "
        "above the threshold of $10.00 and at least 3 days"
    )


def test_a_short_runway_says_how_many_days_are_left():
    check = credit.assess(30.0, threshold=10, min_runway_days=3, charges=spent(140.0), service_now=NOW)
    assert check.describe() == (
        "The account's credit is $30.00, about 1.5 days left at $20.00/day: less than the 3 days asked for"
    )


# --- A service that cannot tell -----------------------------------------------------------------------------------
def test_a_service_without_the_accounts_money_fails_the_sensor_saying_so_even_with_soft_fail():
    """Not as AirflowFailException, which soft_fail (the healthy day's way to end) would turn into a skip."""
    op = sensor(Account_(1.0, missing=True), threshold=25, soft_fail=True)
    with pytest.raises(GpuMarketNotFoundError, match="no GET /api/v0/users/current") as caught:
        op.execute({})
    assert not isinstance(caught.value, AirflowFailException)


def test_an_account_with_neither_credit_nor_balance_is_an_error_not_a_guess():
    with pytest.raises(GpuMarketError, match="neither credit nor balance"):
        sensor(Account_(None), threshold=25).poke({})
