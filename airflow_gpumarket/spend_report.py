"""The spend report as pure rules: the service's charges over a window, attributed through the budget ledger.

An instance's charges belong to the DAG (and the team) of the ledger entry that names the instance: the rental a task
recorded. An instance charge that no entry names is **leaked-looking**: no task recorded renting that instance (it was
rented by hand, by another tool, or leaked before a task could record it). A charge of no instance (a volume, a
serverless endpoint) is listed by its type. No I/O here: ``operators/spend_report.py`` reads the charges and the
ledger.

Money is summed as ``Decimal`` from each amount's shortest decimal form, so a total is exact; figures are rounded to
``MONEY_DIGITS`` places only when shown.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from airflow_gpumarket.api import Charge
from airflow_gpumarket.exceptions import GpuMarketValidationError

#: The team of a DAG that has no ``team:<name>`` tag (``budgets.team_of``).
NO_TEAM = "(no team)"
#: Figures are shown, and handed to XCom, with this many decimal places.
MONEY_DIGITS = 4
_QUANTUM = Decimal(1).scaleb(-MONEY_DIGITS)
#: The window when neither the task nor its DAG run gives one: the day up to now.
DEFAULT_WINDOW_SECONDS = 86400.0
#: The width of the amount column of the table.
_AMOUNT_WIDTH = 14


def dollars(amount: float | int | str | Decimal) -> Decimal:
    """An amount as an exact ``Decimal``; a float from its shortest decimal form (0.1, not 0.1000000000000000055)."""
    if isinstance(amount, Decimal):
        return amount
    return Decimal(repr(amount)) if isinstance(amount, float) else Decimal(amount)


def rounded(amount: Decimal) -> Decimal:
    """``amount`` to ``MONEY_DIGITS`` places, half up."""
    return amount.quantize(_QUANTUM, rounding=ROUND_HALF_UP)


def utc_day(epoch: float) -> str:
    """The UTC date (YYYY-MM-DD) of an epoch second."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d")


def utc_time(epoch: float) -> str:
    """An epoch second as ``YYYY-MM-DD HH:MM UTC``."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def epoch_seconds(name: str, value: Any) -> float | None:
    """A moment as epoch seconds: a datetime (naive is UTC), ISO 8601 text (as a template renders one), or a number.

    None and empty text are None. Raises ``GpuMarketValidationError`` naming ``name`` for anything else.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
        try:
            return epoch_seconds(name, dt.datetime.fromisoformat(text))
        except ValueError:
            pass
    raise GpuMarketValidationError(
        name, f"must be a datetime, ISO 8601 text such as '2026-01-31T00:00:00+00:00' or epoch seconds, got {value!r}"
    )


def window(
    start: Any,
    end: Any,
    *,
    interval_start: Any = None,
    interval_end: Any = None,
    now: float,
) -> tuple[float, float]:
    """The report's window in epoch seconds: ``start`` and ``end`` when given, else the data interval's bounds.

    A run with no data interval, or an empty one (a DAG without a schedule), reports the ``DEFAULT_WINDOW_SECONDS``
    up to ``now``. Raises ``GpuMarketValidationError`` when the window would end before it starts.
    """
    given_start, given_end = epoch_seconds("window_start", start), epoch_seconds("window_end", end)
    low, high = epoch_seconds("data_interval_start", interval_start), epoch_seconds("data_interval_end", interval_end)
    if low is None or high is None or high <= low:
        low, high = now - DEFAULT_WINDOW_SECONDS, now
    window_start = low if given_start is None else given_start
    window_end = high if given_end is None else given_end
    if window_end <= window_start:
        raise GpuMarketValidationError(
            "window_end", f"must be after window_start ({utc_time(window_start)}), got {utc_time(window_end)}"
        )
    return window_start, window_end


@dataclass(frozen=True)
class Rental:
    """What a ledger entry says about the instance it names: the DAG and team that rented it."""

    dag_id: str
    team: str


@dataclass(frozen=True)
class LeakedCharge:
    """The charges of one instance that no ledger entry names: their sum and the UTC days they fall on."""

    instance_id: int
    amount: Decimal
    days: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "amount": float(rounded(self.amount)), "days": list(self.days)}


@dataclass(frozen=True)
class SpendReport:
    """What the account was charged from ``start`` to ``end`` (epoch seconds), and whose rentals it was for.

    ``per_dag`` and ``per_team`` count the charges of recorded rentals; ``leaked`` the instance charges no ledger
    entry names; ``other`` the charges of no instance, by type. ``total`` is every charge: the sum of the three.
    """

    start: float
    end: float
    charges: int
    per_dag: dict[str, Decimal] = field(default_factory=dict)
    per_team: dict[str, Decimal] = field(default_factory=dict)
    leaked: tuple[LeakedCharge, ...] = ()
    other: dict[str, Decimal] = field(default_factory=dict)

    @property
    def recorded(self) -> Decimal:
        """The charges of rentals a task recorded."""
        return sum(self.per_dag.values(), Decimal(0))

    @property
    def leaked_total(self) -> Decimal:
        return sum((leak.amount for leak in self.leaked), Decimal(0))

    @property
    def other_total(self) -> Decimal:
        return sum(self.other.values(), Decimal(0))

    @property
    def total(self) -> Decimal:
        return self.recorded + self.leaked_total + self.other_total

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON values for XCom: dollars as numbers rounded to ``MONEY_DIGITS`` places."""

        def money(values: Mapping[str, Decimal]) -> dict[str, float]:
            return {name: float(rounded(amount)) for name, amount in values.items()}

        return {
            "start": self.start,
            "end": self.end,
            "charges": self.charges,
            "total": float(rounded(self.total)),
            "recorded": float(rounded(self.recorded)),
            "per_dag": money(self.per_dag),
            "per_team": money(self.per_team),
            "leaked": [leak.to_dict() for leak in self.leaked],
            "leaked_total": float(rounded(self.leaked_total)),
            "other": money(self.other),
            "other_total": float(rounded(self.other_total)),
        }

    def table(self) -> str:
        """The report as fixed-width text for the task log: one section per view, each with its total line."""
        title = (
            f"GPU Market spend from {utc_time(self.start)} to {utc_time(self.end)}: "
            f"{self.charges} charge{'' if self.charges == 1 else 's'}"
        )
        sections = [
            _Section("", "DAG", [*self.per_dag.items()], "Recorded rentals", self.recorded),
            _Section("", "Team", [*self.per_team.items()], "Recorded rentals", self.recorded),
        ]
        if self.leaked:
            leaks = [(f"instance {leak.instance_id}", leak.amount, ", ".join(leak.days)) for leak in self.leaked]
            heading = "Leaked-looking: charged instances that no task recorded renting"
            sections.append(_Section(heading, "Instance", leaks, "Not recorded", self.leaked_total, "Days"))
        if self.other:
            others = [*self.other.items()]
            sections.append(_Section("", "Charges of no instance", others, "Other charges", self.other_total))
        names = [TOTAL_NAME, *(name for section in sections for name in section.names())]
        width = max(len(name) for name in names) + 2 + _AMOUNT_WIDTH
        total = "=" * width + "\n" + _line(TOTAL_NAME, self.total, width)
        return "\n\n".join([title, *(section.render(width) for section in sections), total])


#: The last line of the table.
TOTAL_NAME = "Total charged"


@dataclass(frozen=True)
class _Section:
    """One view of the table: a column of names, a column of dollars (and maybe another), a rule, its total."""

    heading: str
    header: str
    rows: list[tuple[Any, ...]]
    total_name: str
    total: Decimal
    extra: str = ""

    def names(self) -> list[str]:
        return [self.header, self.total_name, *(str(row[0]) for row in self.rows)]

    def render(self, width: int) -> str:
        head = f"{self.header:<{width - _AMOUNT_WIDTH}}{'Amount ($)':>{_AMOUNT_WIDTH}}"
        lines = [self.heading] if self.heading else []
        lines += [f"{head}   {self.extra}".rstrip(), "-" * width]
        lines += [_line(str(row[0]), row[1], width, *row[2:]) for row in self.rows] or ["(none)"]
        lines += ["-" * width, _line(self.total_name, self.total, width)]
        return "\n".join(lines)


def _line(name: str, amount: Decimal, width: int, extra: str = "") -> str:
    """A name left-aligned, dollars right-aligned to ``MONEY_DIGITS`` places ending at ``width``, then ``extra``."""
    text = f"{name:<{width - _AMOUNT_WIDTH}}{rounded(amount):>{_AMOUNT_WIDTH},.{MONEY_DIGITS}f}"
    return f"{text}   {extra}".rstrip()


def rentals_by_instance(entries: Iterable[Mapping[str, Any]]) -> dict[int, Rental]:
    """Each instance the ledger names, with the DAG and team of its latest entry (a retry's entry wins)."""
    found: dict[int, tuple[tuple[float, int], Rental]] = {}
    for entry in entries:
        instance_id = entry.get("instance_id")
        if instance_id is None or isinstance(instance_id, bool):
            continue  # a reservation whose create made nothing
        order = (float(entry.get("created_at") or 0), int(entry.get("id") or 0))
        rental = Rental(dag_id=str(entry.get("dag_id") or ""), team=str(entry.get("team") or NO_TEAM))
        if int(instance_id) not in found or order >= found[int(instance_id)][0]:
            found[int(instance_id)] = (order, rental)
    return {instance_id: rental for instance_id, (_, rental) in found.items()}


def _by_amount(totals: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Largest first, then by name: the order a reader scans a bill in."""
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def build(
    charges: Iterable[Charge],
    entries: Iterable[Mapping[str, Any]],
    *,
    start: float,
    end: float,
) -> SpendReport:
    """The spend report of ``charges`` (the service's, over ``start``..``end``) given the ledger's ``entries``.

    Only each charge's own ``amount`` counts: its ``items`` are its breakdown, already in it.
    """
    rentals = rentals_by_instance(entries)
    per_dag: dict[str, Decimal] = {}
    per_team: dict[str, Decimal] = {}
    leaked: dict[int, Decimal] = {}
    leaked_days: dict[int, set[str]] = {}
    other: dict[str, Decimal] = {}
    count = 0
    for charge in charges:
        count += 1
        amount = dollars(charge.amount)
        if charge.instance_id is None:
            kind = charge.type or "(no type)"
            other[kind] = other.get(kind, Decimal(0)) + amount
        elif (rental := rentals.get(charge.instance_id)) is not None:
            per_dag[rental.dag_id] = per_dag.get(rental.dag_id, Decimal(0)) + amount
            per_team[rental.team] = per_team.get(rental.team, Decimal(0)) + amount
        else:
            leaked[charge.instance_id] = leaked.get(charge.instance_id, Decimal(0)) + amount
            when = charge.start if charge.start is not None else charge.end
            days = leaked_days.setdefault(charge.instance_id, set())
            if when is not None:
                days.add(utc_day(when))
    leaks = [LeakedCharge(i, amount, tuple(sorted(leaked_days[i]))) for i, amount in leaked.items()]
    return SpendReport(
        start=start,
        end=end,
        charges=count,
        per_dag=_by_amount(per_dag),
        per_team=_by_amount(per_team),
        leaked=tuple(sorted(leaks, key=lambda leak: (-leak.amount, leak.instance_id))),
        other=_by_amount(other),
    )
