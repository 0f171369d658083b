"""Sensor that waits for the account's credit to run low, so a notifier on its success can say so."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, credit
from airflow_gpumarket._compat import BaseSensorOperator, PokeReturnValue

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

#: Seconds between reads of the credit by default: the credit moves by the hour of billing.
CHECK_INTERVAL_SECONDS = 3600.0


class GpuMarketCreditSensor(BaseSensorOperator):
    """Wait until the account's credit is at or below ``threshold`` dollars, or lasts fewer than ``runway_days``.

    The credit is ``hook.account().available`` (the prepaid credit left, else the balance). With ``runway_days``,
    the runway is that credit divided by the average daily charges of the last 7 days (``hook.charges``). The
    sensor returns the figures (XCom) when it succeeds: ``available``, ``threshold``, ``burn_per_day``,
    ``runway_days``, ``min_runway_days`` and ``low``.

    Meant for a watch: ``mode="reschedule"`` (no worker slot held between reads), an alert by any Airflow notifier in
    ``on_success_callback``, and ``timeout`` with ``soft_fail=True`` so a run in which the credit stayed healthy ends
    skipped, not failed.

    :param threshold: dollars; the credit at or below it is low (templated).
    :param runway_days: also low when the credit lasts fewer days than this at the last 7 days' burn; None (the
        default) does not read the charges (templated).
    :param gpumarket_conn_id: the connection whose account is watched.
    :param poke_interval: seconds between reads (default 3600).
    """

    template_fields: Sequence[str] = ("threshold", "runway_days")

    def __init__(
        self,
        *,
        threshold: float | str,
        runway_days: float | str | None = None,
        gpumarket_conn_id: str = "gpumarket_default",
        poke_interval: timedelta | float = CHECK_INTERVAL_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.threshold = threshold
        self.runway_days = runway_days
        self.gpumarket_conn_id = gpumarket_conn_id
        api.require_positive_number("poke_interval", self.poke_interval)
        # Bad input costs nothing: refused when the DAG is parsed, unless it is known only at run time.
        credit.check_arguments(threshold, runway_days)

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)

    def poke(self, context: Any) -> PokeReturnValue:
        threshold, runway_days = credit.check_threshold(self.threshold), credit.check_runway_days(self.runway_days)
        # A service without the account's money raises GpuMarketNotFoundError saying so. It is not turned into
        # AirflowFailException: with soft_fail=True Airflow would skip that, hiding a watch that can never work.
        check = credit.read(self.hook, threshold=threshold, min_runway_days=runway_days)
        if check.low:
            self.log.warning("%s", check.describe())
        else:
            self.log.info("%s", check.describe())
        return PokeReturnValue(is_done=check.low, xcom_value=check.to_dict() if check.low else None)
