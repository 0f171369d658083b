"""The credit watch as pure rules: whether the account's credit is low, by a threshold or by the days it will last.

The runway is the credit left divided by the daily burn, the charges of the last ``BURN_DAYS`` days averaged over
them. ``GpuMarketCreditSensor`` and ``GpuMarketLowCreditNotifier`` decide with :func:`assess`; :func:`read` is the
one place they read the service (through the hook they are given).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from airflow_gpumarket.api import Charge, require_non_negative_number, require_positive_number
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.spend_report import dollars

#: The burn is the average of this many days of charges.
BURN_DAYS = 7
_DAY_SECONDS = 86400.0


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
            return f"nothing charged in the last {BURN_DAYS} days"
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


def _number(name: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise GpuMarketValidationError(name, f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GpuMarketValidationError(name, f"must be a number, got {value!r}")
    return float(value)


def burn_per_day(charges: Iterable[Charge], days: float = BURN_DAYS) -> float:
    """Dollars charged per day, on average, by ``charges`` (those of the last ``days`` days); summed exactly."""
    total = sum((dollars(charge.amount) for charge in charges), Decimal(0))
    return float(total / Decimal(repr(float(days))))


def runway(available: float, burn: float) -> float:
    """Days the credit lasts at ``burn`` dollars a day: ``inf`` with no burn, 0 when nothing is left."""
    if available <= 0:
        return 0.0
    return math.inf if burn <= 0 else available / burn


def assess(
    available: float,
    *,
    threshold: float,
    min_runway_days: float | None = None,
    charges: Iterable[Charge] | None = None,
) -> CreditCheck:
    """Whether ``available`` dollars are low: at or below ``threshold``, or lasting under ``min_runway_days``.

    :param charges: the charges of the last ``BURN_DAYS`` days; needed only with ``min_runway_days``.
    """
    if min_runway_days is None:
        return CreditCheck(available=available, threshold=threshold)
    burn = burn_per_day(charges or ())
    return CreditCheck(
        available=available,
        threshold=threshold,
        burn_per_day=round(burn, 6),
        runway_days=runway(available, burn),
        min_runway_days=min_runway_days,
    )


def read(hook: Any, *, threshold: float, min_runway_days: float | None = None, now: float | None = None) -> CreditCheck:
    """The account's credit read through ``hook`` (and, for a runway, the last ``BURN_DAYS`` days of charges).

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
    if min_runway_days is not None:
        now = time.time() if now is None else now
        charges = hook.charges(now - BURN_DAYS * _DAY_SECONDS, now)
    return assess(available, threshold=threshold, min_runway_days=min_runway_days, charges=charges)
