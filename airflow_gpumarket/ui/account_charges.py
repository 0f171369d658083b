"""The account's charges as the GPU rentals page reads them, from plain inputs.

The window's days, the charges of several connections merged, each instance's charges summed, the charges no rental
owns, and the runway: the credit left over the burn rate of the last ``RUNWAY_DAYS`` full days' charges (UTC, the
service's clock). Money is summed as exact decimals (``dollars``: what the service's JSON said).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from airflow_gpumarket import credit, spend_report

if TYPE_CHECKING:
    from airflow_gpumarket.api import Charge

DAY = credit.DAY_SECONDS
#: The full days (UTC, on the service's clock) whose charges give the runway's burn rate (``credit.burn``).
RUNWAY_DAYS = credit.BURN_DAYS
ZERO = Decimal(0)
#: Beyond this a runway is only "more than": a date that far out is no date at all.
LONGEST_RUNWAY_DAYS = Decimal(36500)


def dollars(value: float | Decimal | None) -> Decimal | None:
    """A dollar figure as an exact decimal (``spend_report.dollars``), or None."""
    return None if value is None else spend_report.dollars(value)


def day_start(epoch: float) -> float:
    """The UTC midnight that begins ``epoch``'s day."""
    return epoch - epoch % DAY


def charges_window(since: float, service_now: float) -> tuple[float, float]:
    """The days one charges read covers: the page's window's (from its first midnight) and the runway's, to now.

    ``service_now``: the service's time (its clock may run apart from this host's).
    """
    return min(day_start(since), credit.burn_window(service_now)[0]), service_now


charge_time = credit.charge_time


def merged_charges(lists: Iterable[Iterable[Charge]]) -> list[Charge]:
    """The charges of several connections, each as often as one connection gives it.

    Two connections of one account read the same charges; those of two accounts never share a record.
    """
    merged: Counter[Charge] = Counter()
    for charges in lists:
        merged |= Counter(charges)
    return list(merged.elements())


@dataclass(frozen=True)
class Charged:
    """An instance's charges over the window's days, summed exactly."""

    amount: Decimal
    #: The end of its latest charge: what it cost after that is not posted yet.
    until: float | None = None


def instance_charges(charges: Iterable[Charge], window_start: float) -> dict[int, Charged]:
    """Each charged instance's charges of the window's days (from the first midnight; one with no time counts)."""
    first = day_start(window_start)
    sums: dict[int, Decimal] = defaultdict(Decimal)
    until: dict[int, float | None] = {}
    for charge in charges:
        when = charge_time(charge)
        if charge.instance_id is None or (when is not None and when < first):
            continue
        sums[charge.instance_id] += dollars(charge.amount) or ZERO
        ends = [t for t in (until.get(charge.instance_id), charge.end) if t is not None]
        until[charge.instance_id] = max(ends, default=None)
    return {i: Charged(amount, until[i]) for i, amount in sums.items()}


@dataclass(frozen=True)
class Unowned:
    """Charges of the window's days that no DAG's rental takes."""

    #: Of instances that no task recorded and whose label names no task instance found.
    instances: Decimal = ZERO
    instance_ids: tuple[int, ...] = ()
    #: Of no instance (volumes, serverless endpoints, ...).
    other: Decimal = ZERO


def unowned(charges: Iterable[Charge], owned: Iterable[int], window_start: float) -> Unowned:
    """The charges of the window's days of the instances not ``owned`` (of a rental some task instance owns)."""
    first, mine = day_start(window_start), set(owned)
    instances, other, ids = ZERO, ZERO, set()
    for charge in charges:
        when = charge_time(charge)
        if when is not None and when < first:
            continue
        if charge.instance_id is None:
            other += dollars(charge.amount) or ZERO
        elif charge.instance_id not in mine:
            instances += dollars(charge.amount) or ZERO
            ids.add(charge.instance_id)
    return Unowned(instances, tuple(sorted(ids)), other)


@dataclass(frozen=True)
class Runway:
    """How long the credit left lasts at the account's recent burn rate."""

    available: Decimal | None
    #: The charges of the last ``RUNWAY_DAYS`` full days; None when the service gave no charges.
    burn: Decimal | None
    #: The service's time it was read at.
    now: float

    @property
    def daily(self) -> Decimal | None:
        return None if self.burn is None else self.burn / RUNWAY_DAYS

    @property
    def days(self) -> Decimal | None:
        """Days until the credit is spent; None without a credit, without charges, or with no recent spend."""
        daily = self.daily
        if self.available is None or not daily or daily <= 0:
            return None
        return max(ZERO, self.available / daily)

    @property
    def runs_out_at(self) -> float | None:
        """When the credit runs out; None without a runway or beyond ``LONGEST_RUNWAY_DAYS``."""
        days = self.days
        return None if days is None or days > LONGEST_RUNWAY_DAYS else self.now + float(days) * DAY


def runway(available: float | None, charges: Iterable[Charge] | None, service_now: float) -> Runway:
    """The runway of ``available`` dollars at the burn rate of the last ``RUNWAY_DAYS`` full UTC days.

    Full days: those before the service's today, whose charges are (mostly) posted. ``charges``: None when the service
    gave none; one with no time cannot be placed in a day and does not count.
    """
    burn = None if charges is None else credit.burn(charges, service_now)
    return Runway(dollars(available), burn, service_now)


@dataclass(frozen=True)
class Balance:
    """One connection's account: its runway, or why the page has none."""

    conn_id: str
    runway: Runway | None
    problem: str | None = None
