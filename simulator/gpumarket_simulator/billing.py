"""The account's money: each instance's ledger by UTC day, the prepaid credit, its top-ups, and the $0 stop's record.

Bookkeeping only: ``World`` decides what is billed and when, and calls in here with the simulated time. The
ledger keeps the floats it adds up (nothing is rounded), so a charge listed for a day is exactly that day's
ledger, and the credit is what was put in minus everything billed, to float precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SECONDS_PER_DAY = 86_400
#: The default world's starting credit, in dollars (a world file's ``credit`` or ``--credit`` replace it).
DEFAULT_CREDIT = 100.0
#: A credit at or below this many dollars has run out: a ledger of float sums leaves dust around zero.
CREDIT_EPSILON = 1e-9
#: ``status_msg`` of an instance the $0 stop stopped.
CREDIT_STOP_MSG = "Stopped: the account's credit ran out. Add credit, then start the instance again."
#: What the live service calls the ledger's three parts, as the types of a charge's items.
ITEM_TYPES = ("gpu", "storage", "bandwidth")


def dollars(amount: float) -> str:
    """``$12.50`` or ``-$0.42`` (float dust around zero is ``$0.00``)."""
    cents = round(amount * 100)
    return f"-${-cents / 100:,.2f}" if cents < 0 else f"${cents / 100:,.2f}"


def day_of(t: float) -> int:
    """The start (epoch seconds) of the UTC day ``t`` falls in."""
    return int(math.floor(t / SECONDS_PER_DAY)) * SECONDS_PER_DAY


@dataclass
class DayLedger:
    """What one instance was billed during one UTC day, and when within it."""

    day: int
    start: float
    end: float
    compute_seconds: float = 0.0
    compute_dollars: float = 0.0
    #: When compute was first and last billed this day (None: not at all).
    compute_start: float | None = None
    compute_end: float | None = None
    storage_seconds: float = 0.0
    storage_dollars: float = 0.0
    bandwidth_up_bytes: int = 0
    bandwidth_down_bytes: int = 0
    bandwidth_dollars: float = 0.0
    bandwidth_start: float | None = None
    bandwidth_end: float | None = None
    #: Where this day ends: the next day's start.
    next_day: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_day = float(self.day + SECONDS_PER_DAY)

    @property
    def amount(self) -> float:
        return self.compute_dollars + self.storage_dollars + self.bandwidth_dollars

    # Called for every live instance on every update: kept lean (no allocation, no function calls).
    def add_time(self, a: float, b: float, storage_dollars: float, compute_dollars: float | None) -> None:
        """Bill ``[a, b)`` (inside this day): storage always, compute when ``compute_dollars`` is not None."""
        if a < self.start:
            self.start = a
        if b > self.end:
            self.end = b
        self.storage_seconds += b - a
        self.storage_dollars += storage_dollars
        if compute_dollars is not None:
            self.compute_seconds += b - a
            self.compute_dollars += compute_dollars
            if self.compute_start is None:
                self.compute_start = a
            self.compute_end = b

    def add_bandwidth(self, at: float, moved: int, dollars: float, *, up: bool) -> None:
        self.start, self.end = min(self.start, at), max(self.end, at)
        if up:
            self.bandwidth_up_bytes += moved
        else:
            self.bandwidth_down_bytes += moved
        self.bandwidth_dollars += dollars
        self.bandwidth_start = at if self.bandwidth_start is None else min(self.bandwidth_start, at)
        self.bandwidth_end = at if self.bandwidth_end is None else max(self.bandwidth_end, at)

    def view(self) -> dict[str, Any]:
        """The day as ``/_sim/state`` shows it, in the ledger's own names."""
        return {
            "day": self.day,
            "start": self.start,
            "end": self.end,
            "compute_seconds": self.compute_seconds,
            "compute_cost": self.compute_dollars,
            "storage_seconds": self.storage_seconds,
            "storage_cost": self.storage_dollars,
            "bandwidth_up_bytes": self.bandwidth_up_bytes,
            "bandwidth_down_bytes": self.bandwidth_down_bytes,
            "bandwidth_cost": self.bandwidth_dollars,
            "cost": self.amount,
        }


@dataclass
class Invoice:
    """Money put into (or, for a negative ``added``, taken out of) the account."""

    id: int
    when: float
    added: float
    service: str
    source: str
    description: str

    def view(self) -> dict[str, Any]:
        return {
            "invoice_id": self.id,
            "when": self.when,
            "added": self.added,
            "service": self.service,
            "source": self.source,
            "description": self.description,
        }


#: ``service`` of the world's starting credit and of the admin's changes (``service`` is what invoices filter on).
SIGNUP_SERVICE = "signup_credit"
ADMIN_SERVICE = "sim_admin"


@dataclass
class Account:
    """The prepaid account: credit put in, money billed, and the moments the credit ran out."""

    added: float = 0.0
    spent: float = 0.0
    #: The credit ran out and has not been topped up above $0 since: nothing may start.
    exhausted: bool = False
    invoices: list[Invoice] = field(default_factory=list)
    #: Every $0 stop: ``{"t", "credit", "stopped": [instance ids]}``.
    stops: list[dict[str, Any]] = field(default_factory=list)
    #: Stops not yet copied into the request log (the market drains them).
    unlogged: list[dict[str, Any]] = field(default_factory=list)
    #: None: a day's charges are listed as they accrue. A number: only once the UTC day has ended and this many more
    #: seconds have passed, as a service that posts its bills later does.
    charges_delay: float | None = None

    @property
    def credit(self) -> float:
        return self.added - self.spent

    def add(self, amount: float, when: float, *, service: str, source: str, description: str) -> Invoice:
        invoice = Invoice(len(self.invoices) + 1, when, amount, service, source, description)
        self.invoices.append(invoice)
        self.added += amount
        if self.credit > CREDIT_EPSILON:
            self.exhausted = False
        return invoice

    def record_stop(self, at: float, stopped: list[int]) -> None:
        event = {"t": at, "credit": self.credit, "stopped": stopped}
        self.stops.append(event)
        self.unlogged.append(event)

    def view(self) -> dict[str, Any]:
        return {
            "credit": self.credit,
            "balance": self.credit,
            "added": self.added,
            "spent": self.spent,
            "exhausted": self.exhausted,
            "invoices": [i.view() for i in self.invoices],
            "stops": [dict(s, stopped=list(s["stopped"])) for s in self.stops],
            "charges_delay": self.charges_delay,
        }
