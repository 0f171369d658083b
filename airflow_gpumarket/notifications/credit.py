"""Notifier that checks the account's credit when its callback fires, and passes the alert on only when it is low."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import credit
from airflow_gpumarket._compat import BaseNotifier

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

#: The context key under which the wrapped notifiers find the figures (``CreditCheck.to_dict``).
CONTEXT_KEY = "gpumarket_credit"


class GpuMarketLowCreditNotifier(BaseNotifier):
    """Read the account's credit and, when it is low, log a warning and call the notifiers it wraps.

    For a callback of a task that spends (or of the spend report), where a separate watch task is not wanted: e.g.
    ``on_success_callback=GpuMarketLowCreditNotifier(threshold=50, notifiers=[SlackNotifier(...)])``. Low means
    what it means for ``GpuMarketCreditSensor``: at or below ``threshold`` dollars, or, with ``runway_days``, lasting
    fewer days at the last 7 days' burn. The wrapped notifiers get the callback's context, with the figures under
    ``gpumarket_credit`` (``available``, ``threshold``, ``burn_per_day``, ``runway_days``, ...) for their templates.
    A credit that is not low logs one line and calls nothing.

    :param threshold: dollars; the credit at or below it is low (templated).
    :param runway_days: also low when the credit lasts fewer days than this; None reads no charges (templated).
    :param notifiers: notifiers (or any callbacks taking the context) to call when the credit is low; with none,
        the warning in the log is the alert.
    :param gpumarket_conn_id: the connection whose account is read.
    """

    template_fields = ("threshold", "runway_days")

    def __init__(
        self,
        *,
        threshold: float | str,
        runway_days: float | str | None = None,
        notifiers: Sequence[Callable[[Any], Any]] | Callable[[Any], Any] = (),
        gpumarket_conn_id: str = "gpumarket_default",
    ) -> None:
        super().__init__()
        self.threshold = threshold
        self.runway_days = runway_days
        self.notifiers = [notifiers] if callable(notifiers) else list(notifiers)
        self.gpumarket_conn_id = gpumarket_conn_id
        credit.check_arguments(threshold, runway_days)

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)

    def notify(self, context: Any) -> None:
        check = credit.read(
            self.hook,
            threshold=credit.check_threshold(self.threshold),
            min_runway_days=credit.check_runway_days(self.runway_days),
        )
        if not check.low:
            self.log.info("%s", check.describe())
            return
        self.log.warning("%s", check.describe())
        context[CONTEXT_KEY] = check.to_dict()
        for notifier in self.notifiers:
            try:
                notifier(context)
            except Exception:  # noqa: BLE001 - one notifier that fails must not keep the others from alerting
                self.log.exception("The low-credit notifier %r failed", notifier)
