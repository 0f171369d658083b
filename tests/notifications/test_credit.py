"""GpuMarketLowCreditNotifier (notifications/credit.py) with a fake hook: it calls the notifiers it wraps when the
credit is low, and only then, handing them the figures."""

from __future__ import annotations

from datetime import datetime

import pytest

from airflow_gpumarket._compat import BaseNotifier
from airflow_gpumarket.api import Account
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.notifications.credit import GpuMarketLowCreditNotifier

NOW = 1_767_225_600.0  # the service's time in these tests


class Credit:
    """A fake hook whose account has ``left`` dollars of credit and no charges."""

    def __init__(self, left: float) -> None:
        self.left = left

    def service_now(self):
        return NOW

    def account(self):
        return Account(credit=self.left, balance=None, user_id=1, email=None, username=None)

    def charges(self, start, end, *, types=None):
        return []


class Sent(BaseNotifier):
    """A notifier that keeps what it would have sent: its message, rendered with the callback's context."""

    template_fields = ("message",)

    def __init__(self, message: str = "sent") -> None:
        super().__init__()
        self.message = message
        self.sent: list[str] = []

    def notify(self, context):
        self.sent.append(self.message)


def watching(left: float, *notifiers, **kwargs) -> GpuMarketLowCreditNotifier:
    notifier = GpuMarketLowCreditNotifier(notifiers=list(notifiers), **{"threshold": 25, **kwargs})
    notifier.__dict__["hook"] = Credit(left)  # the cached_property, replaced
    return notifier


@pytest.fixture
def context():
    from airflow.providers.common.compat.sdk import DAG

    return {"dag": DAG("spend", schedule=None, start_date=datetime(2026, 1, 1)), "params": {"threshold": 50}}


def test_the_wrapped_notifiers_are_called_when_the_credit_is_below_the_threshold(context):
    first, second = Sent(), Sent()
    watching(10.0, first, second)(context)
    assert first.sent == ["sent"] and second.sent == ["sent"]


def test_nothing_is_called_when_the_credit_is_above_the_threshold(context, task_log):
    wrapped = Sent()
    watching(25.01, wrapped)(context)
    assert wrapped.sent == []
    assert "above the threshold of $25.00" in task_log()


def test_the_wrapped_notifiers_get_the_figures_in_their_context(context):
    wrapped = Sent("GPU credit ${{ gpumarket_credit.available }}, threshold ${{ gpumarket_credit.threshold }}")
    watching(12.5, wrapped)(context)
    assert wrapped.sent == ["GPU credit $12.5, threshold $25.0"]


def test_without_wrapped_notifiers_the_alert_is_a_warning_in_the_log(context, task_log):
    watching(3.0)(context)
    assert "The account's credit is $3.00: at or below the threshold of $25.00" in task_log()


def test_a_plain_callback_is_wrapped_too(context):
    called = []
    watching(3.0, lambda ctx: called.append(ctx["gpumarket_credit"]["available"]))(context)
    assert called == [3.0]


def test_one_failing_notifier_does_not_keep_the_next_from_alerting(context):
    def broken(ctx):
        raise RuntimeError("slack is down")

    after = Sent()
    watching(3.0, broken, after)(context)
    assert after.sent == ["sent"]


def test_the_threshold_may_be_a_template_rendered_when_the_callback_fires(context):
    wrapped = Sent()
    watching(40.0, wrapped, threshold="{{ params.threshold }}")(context)  # 40 is below the rendered 50
    assert wrapped.sent == ["sent"]


@pytest.mark.parametrize(("arguments", "field"), [({"threshold": -5}, "threshold"), ({"runway_days": "x"}, "runway")])
def test_bad_input_is_refused_when_the_dag_is_parsed(arguments, field):
    with pytest.raises(GpuMarketValidationError) as caught:
        GpuMarketLowCreditNotifier(**{"threshold": 25, **arguments})
    assert caught.value.field.startswith(field)
