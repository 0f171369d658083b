"""Budgets as pure rules: where they are set, what a rental may cost at worst, and whether it fits.

Budgets are set in one Airflow Variable, ``gpumarket_budgets``: a JSON object whose keys are DAG ids (``"*"``: every
DAG not named) and whose values give dollars per UTC ``day``, ISO ``week`` (from Monday), calendar ``month`` and DAG
``run``. A task's own cap is its ``max_cost`` argument. No I/O here: ``ledger.py`` keeps the reservations.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpumarket import api

#: The Variable that holds every DAG's budgets.
VARIABLE = "gpumarket_budgets"
#: The key of the budgets that every DAG not named has, each its own.
EVERY_DAG = "*"
#: The periods a DAG's budget may be given for, in the order a refusal names them.
PERIODS = ("run", "day", "week", "month")
#: Reservations are kept to this many decimal places, rounded up: a worst case is never understated.
MONEY_DIGITS = 4


class BudgetConfigError(ValueError):
    """The budgets Variable is malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class Limits:
    """One DAG's budgets in dollars (None: no budget for that period)."""

    run: float | None = None
    day: float | None = None
    week: float | None = None
    month: float | None = None

    def given(self) -> dict[str, float]:
        return {period: value for period in PERIODS if (value := getattr(self, period)) is not None}

    def to_json(self) -> dict[str, float]:
        return self.given()

    @classmethod
    def from_json(cls, raw: Any, where: str = VARIABLE) -> Limits:
        if not isinstance(raw, Mapping):
            raise BudgetConfigError(f'{where} must be an object such as {{"day": 10.0}}; got {raw!r}')
        unknown = sorted(set(raw) - set(PERIODS))
        if unknown:
            raise BudgetConfigError(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; use {', '.join(map(repr, PERIODS))}"
            )
        values: dict[str, float] = {}
        for period, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise BudgetConfigError(f"{where}.{period} must be a number of dollars >= 0; got {value!r}")
            values[period] = float(value)
        return cls(**values)


def _decoded(raw: Any) -> Mapping[str, Any]:
    """The Variable's value (JSON text or decoded) as a mapping; empty when it is not set."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise BudgetConfigError(
                f"The Variable {VARIABLE} is not valid JSON ({exc}); fix it in Admin > Variables"
            ) from None
    if not isinstance(raw, Mapping):
        raise BudgetConfigError(
            f"The Variable {VARIABLE} must be a JSON object of DAG id -> budgets, such as "
            f'{{"my_dag": {{"day": 10.0, "run": 2.5}}}}; got {type(raw).__name__}'
        )
    return raw


def limits_of(raw: Any, dag_id: str) -> tuple[Limits | None, list[str]]:
    """The DAG's budgets from the Variable's value (JSON text or decoded), and a warning per malformed entry it skips.

    Only the entry that applies is checked: the DAG's own, else ``"*"``. A malformed entry that applies to other DAGs
    only is skipped with a warning naming it, so one typo does not stop every DAG's rentals.
    """
    raw = _decoded(raw)
    if not raw:
        return None, []
    applies = dag_id if dag_id in raw else EVERY_DAG
    limits, warnings = None, []
    for key, value in raw.items():
        try:
            parsed = Limits.from_json(value, f"{VARIABLE}[{key!r}]")
        except BudgetConfigError as exc:
            if key == applies:
                raise
            warnings.append(f"{exc}; this entry is skipped, it does not apply to DAG {dag_id!r}")
            continue
        if key == applies:
            limits = parsed
    return (limits if limits is not None and limits.given() else None), warnings


def limits_by_dag(raw: Any, dag_ids: Iterable[str]) -> dict[str, Limits | None]:
    """Each DAG's budgets from the Variable's value: the DAGs it names and ``dag_ids`` (their entry, else ``"*"``).

    Raises ``BudgetConfigError`` naming what is malformed.
    """
    raw = _decoded(raw)
    every = set(dag_ids) | {key for key in raw if key != EVERY_DAG}
    return {dag_id: limits_of(raw, dag_id)[0] for dag_id in sorted(every)}


#: A DAG tag of this form names the DAG's team in the ledger and the spend report.
TEAM_TAG_PREFIX = "team:"


def team_of(tags: Iterable[str] | None) -> str | None:
    """The team a DAG's tags name (``team:<name>``), or None."""
    for tag in sorted(tags or ()):
        if isinstance(tag, str) and tag.startswith(TEAM_TAG_PREFIX) and tag[len(TEAM_TAG_PREFIX) :]:
            return tag[len(TEAM_TAG_PREFIX) :]
    return None


def round_up(dollars: float) -> float:
    """Dollars rounded up to ``MONEY_DIGITS`` places (a bound must not shrink when rounded)."""
    scale = 10**MONEY_DIGITS
    return math.ceil(round(dollars * scale, 6)) / scale


@dataclass(frozen=True)
class WorstCase:
    """What one rental may cost at most, and how that was reckoned (for the refusal's message)."""

    amount: float
    hourly: float
    seconds: float
    capped_by_max_cost: bool = False

    def describe(self) -> str:
        text = f"${self.amount:.4f} (${self.hourly:g}/h for at most {self.seconds / 60:.0f} min"
        return text + (", capped by max_cost)" if self.capped_by_max_cost else ")")


def storage_hourly(disk_gb: float | None, storage_price_per_gb_month: float | None) -> float:
    """What a disk of ``disk_gb`` bills per hour at a price per GB and month (0 when either is unknown)."""
    if not (api.is_positive_number(disk_gb) and api.is_positive_number(storage_price_per_gb_month)):
        return 0.0
    return float(disk_gb) * float(storage_price_per_gb_month) / api.STORAGE_MONTH_HOURS  # type: ignore[arg-type]


def worst_case(
    *,
    hourly_price: float,
    seconds: float,
    disk_gb: float | None = None,
    storage_price_per_gb_month: float | None = None,
    max_cost: float | None = None,
    overshoot_seconds: float = 0.0,
) -> WorstCase:
    """Price × the longest the rental may bill (boot allowance, run time, margins) + its disk, capped by max_cost.

    A rental stopped at ``max_cost`` may run one more poll (``overshoot_seconds``) before it is stopped.
    """
    if not (api.is_positive_number(hourly_price) and math.isfinite(hourly_price)):
        raise ValueError(f"a rental's worst case needs its price in $/h, above $0; got {hourly_price!r}")
    hourly = float(hourly_price) + storage_hourly(disk_gb, storage_price_per_gb_month)
    amount = hourly * seconds / 3600.0
    capped = False
    if max_cost is not None:
        cap = max_cost + hourly * overshoot_seconds / 3600.0
        if cap < amount:
            amount, capped = cap, True
    return WorstCase(round_up(amount), round(hourly, 6), seconds, capped)


#: What a rental's cost is, as a record and a message say: the service's charge, or an estimate (``rental_cost``).
CHARGED, ESTIMATED = "charged", "estimated"


def rental_cost(
    hourly_price: float | None,
    *,
    created_at: float | None,
    running_at: float | None,
    stopped_at: float | None,
    ended_at: float,
    disk_hourly: float = 0.0,
    digits: int = 6,
) -> float | None:
    """A rental's estimated cost by ``ended_at``, every time on the service's clock; None without a price or a start.

    Compute bills at ``hourly_price`` from when the rental was first seen running (else, not known to have loaded
    first, from its creation) until it was seen stopped or ended; its disk bills at ``disk_hourly`` from its creation
    to its end, as the service bills.
    """
    start = running_at if running_at is not None else created_at
    if hourly_price is None or start is None:
        return None
    end = ended_at if stopped_at is None else min(stopped_at, ended_at)
    compute = hourly_price * max(0.0, end - start)
    disk = disk_hourly * max(0.0, ended_at - (created_at if created_at is not None else start))
    return round((compute + disk) / 3600.0, digits)


def window_starts(now: float) -> dict[str, float]:
    """The start (epoch seconds, UTC) of the day, ISO week and calendar month that ``now`` falls in."""
    day = dt.datetime.fromtimestamp(now, dt.timezone.utc)  # noqa: UP017 - dt.UTC is 3.11+; Airflow 2 runs on 3.10
    day = day.replace(hour=0, minute=0, second=0, microsecond=0)
    week = day - dt.timedelta(days=day.weekday())
    month = day.replace(day=1)
    return {"day": day.timestamp(), "week": week.timestamp(), "month": month.timestamp()}


def earliest_window_start(now: float) -> float:
    """The start of the longest of ``now``'s windows (this month's, or the week's when it began the month before)."""
    return min(window_starts(now).values())


@dataclass(frozen=True)
class Entry:
    """One reservation as the check sees it: its DAG run, when it was made, and what it counts for."""

    dag_id: str
    run_id: str
    created_at: float
    amount: float  # its cost once settled, else what it reserved
    open: bool
    conn_id: str = ""
    until: float = math.inf  # when an open reservation's rental can bill no more (its lease's end)


#: What a period's window is called in a refusal.
_WINDOW_WORDS = {"run": "in this DAG run", "day": "today (UTC)", "week": "this week (UTC)", "month": "this month (UTC)"}


def used(entries: Iterable[Entry], *, dag_id: str, run_id: str, now: float) -> dict[str, float]:
    """Dollars spent or reserved by the DAG in each period's current window, and by the run."""
    starts = window_starts(now)
    totals = dict.fromkeys(PERIODS, 0.0)
    for entry in entries:
        if entry.dag_id != dag_id:
            continue
        if entry.run_id == run_id:
            totals["run"] += entry.amount
        for period, start in starts.items():
            if entry.created_at >= start:
                totals[period] += entry.amount
    return {period: round(value, 6) for period, value in totals.items()}


@dataclass(frozen=True)
class Headroom:
    """One budget of a DAG in its current window: the limit, what is settled, what open rentals hold, what is left."""

    period: str
    limit: float
    spent: float
    reserved: float

    @property
    def left(self) -> float:
        return round(self.limit - self.spent - self.reserved, 6)


def headroom(limits: Limits, entries: Iterable[Entry], *, dag_id: str, now: float) -> list[Headroom]:
    """Each of the DAG's day, week and month budgets in the window ``now`` falls in (a run's budget has no window)."""
    starts = window_starts(now)
    mine = [e for e in entries if e.dag_id == dag_id]
    found = []
    for period, limit in limits.given().items():
        if period == "run":
            continue
        current = [e for e in mine if e.created_at >= starts[period]]
        spent = round(sum(e.amount for e in current if not e.open), 6)
        found.append(Headroom(period, limit, spent, round(sum(e.amount for e in current if e.open), 6)))
    return found


def held(entries: Iterable[Entry], *, conn_id: str, now: float) -> float:
    """Dollars that rentals of the connection still running may yet cost: their open reservations."""
    return round(sum(e.amount for e in entries if e.open and e.conn_id == conn_id and e.until > now), 6)


def refusal(
    limits: Limits | None,
    totals: Mapping[str, float],
    worst: float,
    *,
    dag_id: str,
    available: float | None = None,
    held: float = 0.0,
) -> str | None:
    """Why a rental of ``worst`` dollars may not be reserved, or None when it fits every budget and the credit."""
    if limits is not None:
        for period, limit in limits.given().items():
            spent = totals.get(period, 0.0)
            if spent + worst > limit + 1e-9:
                return (
                    f"The {period} budget of DAG {dag_id!r} is ${limit:.2f}: ${spent:.4f} is spent or reserved "
                    f"{_WINDOW_WORDS[period]}, and this rental's worst case is ${worst:.4f}. Nothing was rented; "
                    f"raise {VARIABLE}[{dag_id!r}][{period!r}] or lower max_runtime or max_cost."
                )
    if available is not None and held + worst > available + 1e-9:
        return (
            f"The account's credit is {'-' if available < 0 else ''}${abs(available):.2f}, ${held:.4f} of it is "
            f"reserved by rentals still running, and this rental's worst case is ${worst:.4f}: renting would run into "
            "the service's stop at $0. Nothing was rented; add credit or lower max_runtime or max_cost."
        )
    return None
