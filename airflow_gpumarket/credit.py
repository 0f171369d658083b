"""The credit watch as pure rules: whether the account's credit is low, by a threshold or by the days it will last.

The runway is the credit left divided by the daily burn: the charges of the last ``BURN_DAYS`` full UTC days before
the service's today (whose charges are, mostly, posted), averaged over them. The GPU rentals page uses the same rule.
``GpuMarketCreditSensor`` and ``GpuMarketLowCreditNotifier`` decide with :func:`assess`; :func:`read` is the
one place they read the service (through the hook they are given).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from airflow_gpumarket.api import SECONDS_PER_DAY, Charge, require_non_negative_number, require_positive_number
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.spend_report import dollars

#: The burn is the average of this many full days of charges.
BURN_DAYS = 7
#: What a runway says when the burn window holds no charge (today's do not count: they are still being posted).
NO_BURN = f"nothing charged in the {BURN_DAYS} full UTC days before today"
DAY_SECONDS = float(SECONDS_PER_DAY)


@dataclass(frozen=True)
class CreditCheck:
    """The credit left, the burn it is measured against, and whether that is low.

    ``runway_days`` is None when no runway was asked for, ``inf`` when nothing was charged over the burn window.
    """

    available: float
    threshold: float
    burn_per_day: float | None = None
    runway_days: float | None = None
    min_runway_days: float | None = None

    @property
    def below_threshold(self) -> bool:
        return self.available <= self.threshold

    @property
    def short_runway(self) -> bool:
        return (
            self.min_runway_days is not None
            and self.runway_days is not None
            and self.runway_days < self.min_runway_days
        )

    @property
    def low(self) -> bool:
        """At or below the threshold, or (when a runway is asked for) lasting fewer days than that."""
        return self.below_threshold or self.short_runway

    def describe(self) -> str:
        """One sentence: the credit, and why it is low or why it is not."""
        text = f"The account's credit is ${self.available:,.2f}"
        runway = "" if self.runway_days is None else f", {self._runway()}"
        if self.below_threshold:
            return f"{text}{runway}: at or below the threshold of ${self.threshold:,.2f}"
        if self.short_runway:
            return f"{text}{runway}: less than the {self.min_runway_days:g} days asked for"
        minimum = "" if self.min_runway_days is None else f" and at least {self.min_runway_days:g} days"
        return f"{text}{runway}: above the threshold of ${self.threshold:,.2f}{minimum}"

    def _runway(self) -> str:
        if self.runway_days is None or not math.isfinite(self.runway_days):
            return NO_BURN
        return f"about {self.runway_days:.1f} days left at ${self.burn_per_day or 0:,.2f}/day"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values for XCom (an endless runway is None there)."""
        runway = self.runway_days if self.runway_days is None or math.isfinite(self.runway_days) else None
        return {
            "available": self.available,
            "threshold": self.threshold,
            "burn_per_day": self.burn_per_day,
            "runway_days": None if runway is None else round(runway, 2),
            "min_runway_days": self.min_runway_days,
            "low": self.low,
        }


def check_threshold(threshold: Any) -> float:
    """A threshold in dollars, as given or rendered from a template (text); raises naming the field."""
    value = _number("threshold", threshold)
    require_non_negative_number("threshold", value)
    return value


def check_runway_days(runway_days: Any) -> float | None:
    """A minimum runway in days, or None for none; a rendered template's empty text is none too."""
    if runway_days is None or runway_days == "" or runway_days == "None":
        return None
    value = _number("runway_days", runway_days)
    require_positive_number("runway_days", value)
    return value


def check_arguments(threshold: Any, runway_days: Any) -> None:
    """Refuse a bad threshold or runway when the DAG is parsed; one given as a template waits for its value."""
    from airflow_gpumarket.utils import is_templated

    if not is_templated(threshold):
        check_threshold(threshold)
    if not is_templated(runway_days):
        check_runway_days(runway_days)


def _number(name: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise GpuMarketValidationError(name, f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GpuMarketValidationError(name, f"must be a number, got {value!r}")
    return float(value)


def burn_window(service_now: float) -> tuple[float, float]:
    """The last ``BURN_DAYS`` full UTC days before the service's today, as (start, end) epoch seconds."""
    today = service_now - service_now % DAY_SECONDS
    return today - BURN_DAYS * DAY_SECONDS, today


def charge_time(charge: Charge) -> float | None:
    """When a charge falls: its start, else its end, else None."""
    return charge.start if charge.start is not None else charge.end


def burn(charges: Iterable[Charge], service_now: float) -> Decimal:
    """Dollars charged in ``burn_window(service_now)``, summed exactly; a charge with no time counts nowhere."""
    start, end = burn_window(service_now)
    return sum(
        (dollars(c.amount) for c in charges if (t := charge_time(c)) is not None and start <= t < end), Decimal(0)
    )


def charged_today(charges: Iterable[Charge], service_now: float) -> Decimal:
    """Dollars charged so far in the service's UTC today (outside the burn window: still being posted)."""
    today = burn_window(service_now)[1]
    return sum((dollars(c.amount) for c in charges if (t := charge_time(c)) is not None and t >= today), Decimal(0))


def burn_per_day(charges: Iterable[Charge], service_now: float) -> float:
    """Dollars charged per day, on average, over the burn window."""
    return float(burn(charges, service_now) / BURN_DAYS)


def runway(available: float, daily: float) -> float:
    """Days the credit lasts at ``daily`` dollars a day: ``inf`` with no burn, 0 when nothing is left."""
    if available <= 0:
        return 0.0
    return math.inf if daily <= 0 else available / daily


def assess(
    available: float,
    *,
    threshold: float,
    min_runway_days: float | None = None,
    charges: Iterable[Charge] | None = None,
    service_now: float | None = None,
) -> CreditCheck:
    """Whether ``available`` dollars are low: at or below ``threshold``, or lasting under ``min_runway_days``.

    :param charges: charges covering the burn window; needed only with ``min_runway_days``.
    :param service_now: the service's time (default: this host's).
    """
    if min_runway_days is None:
        return CreditCheck(available=available, threshold=threshold)
    daily = burn_per_day(charges or (), time.time() if service_now is None else service_now)
    return CreditCheck(
        available=available,
        threshold=threshold,
        burn_per_day=round(daily, 6),
        runway_days=runway(available, daily),
        min_runway_days=min_runway_days,
    )


def read(hook: Any, *, threshold: float, min_runway_days: float | None = None, now: float | None = None) -> CreditCheck:
    """The account's credit read through ``hook`` (and, for a runway, the burn window's charges).

    :raises GpuMarketError: the service tells neither credit nor balance, or has no such endpoint (a server that
        follows the spec only); the message says which.
    """
    available = hook.account().available
    if available is None:
        raise GpuMarketError(
            "The service's account answer has neither credit nor balance, so the credit cannot be watched.",
            operation="account",
        )
    charges = None
    now = hook.service_now() if now is None else now
    if min_runway_days is not None:
        charges = hook.charges(*burn_window(now))
    return assess(available, threshold=threshold, min_runway_days=min_runway_days, charges=charges, service_now=now)
