"""The GPU rentals page's data, from plain inputs.

The inputs are the service's instances, the rental records, and the states of the task instances and runs they name. No
I/O here (``sources.py`` reads; ``page.py`` renders), so every rule of the page is unit-tested.

- **Whose**: an instance belongs to the task instance whose record names it, else to the one its label's key
  derives from (``attributed``: label key -> task instance), else to nobody.
- **Live rentals**: every instance the service lists, with its owner.
- **Orphans**: live instances with this provider's label whose lease expired, that no task recorded (unless the
  task its label names still runs), or whose task no longer runs (for ``GpuMarketCreateInstanceOperator``, which
  hands its instance to later tasks: whose DAG run no longer runs).
- **Spend**: per rental, per DAG, per DAG run and per day and DAG, of the rentals created in the window. A rental
  costs what the service charged its instance over the window's days when it charged any (its **actual**), else its
  **estimate**: every time is the service's, and a rental costs its hourly price from when its watcher first saw it
  running (else from its start) to the first end any record gives; one still listed costs its live row's figure.
  One with neither (gone with no end recorded and no charge) is counted apart, as of unknown cost.

The charges no DAG takes and the runway are ``account_charges.py``'s. Money is summed as exact decimals
(``dollars``: what the service's JSON said) and rounded only when shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api, budgets, lifecycle, spend_report
from airflow_gpumarket.ui.account_charges import ZERO, Charged, charge_time, day_start, dollars, instance_charges
from airflow_gpumarket.ui.records import COST_DIGITS, number, price_of

if TYPE_CHECKING:
    from airflow_gpumarket.api import Charge

#: Task instance states in which a renting task still holds (or is about to hold) its rental.
ACTIVE_TASK_STATES = frozenset(
    {"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: DAG run states in which a handed-over instance is still in use.
ACTIVE_RUN_STATES = frozenset({"queued", "running"})


#: A task instance: dag_id, run_id, task_id, map_index.
TiKey = tuple[str, str, str, int]


@dataclass(frozen=True)
class Figure:
    """What one rental cost: the service's charges when it charged the instance (the actual), else the estimate."""

    estimate: Decimal | None
    charged: Charged | None = None
    #: The charges count from the window's first day, and the rental began before it: not its whole cost.
    partial: bool = False

    @property
    def actual(self) -> Decimal | None:
        return None if self.charged is None else self.charged.amount

    @property
    def source(self) -> str:
        """``charges`` or ``estimate``: where ``amount`` comes from."""
        return "estimate" if self.charged is None else "charges"

    @property
    def amount(self) -> Decimal | None:
        return self.estimate if self.charged is None else self.charged.amount

    @property
    def difference(self) -> Decimal | None:
        """Actual minus estimate, when both cover the same time."""
        if self.charged is None or self.estimate is None or self.partial:
            return None
        return self.charged.amount - self.estimate


@dataclass
class Total:
    """A DAG's or a DAG run's spend: the actual of its charged rentals plus the estimate of the others."""

    actual: Decimal = ZERO
    estimated: Decimal = ZERO
    #: Over its rentals with both figures, the sum of actual minus estimate; None when none has both.
    difference: Decimal | None = None
    rentals: int = 0
    estimated_rentals: int = 0

    @property
    def amount(self) -> Decimal:
        return self.actual + self.estimated

    def add(self, figure: Figure) -> None:
        self.rentals += 1
        if figure.charged is None:
            self.estimated += figure.estimate or ZERO
            self.estimated_rentals += 1
        else:
            self.actual += figure.charged.amount
        if (difference := figure.difference) is not None:
            self.difference = (self.difference or ZERO) + difference


@dataclass(frozen=True)
class RecordRow:
    """One rental record, with the task instance that wrote it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    record: Mapping[str, Any]

    @property
    def ti_key(self) -> TiKey:
        return self.dag_id, self.run_id, self.task_id, self.map_index

    @property
    def rental_key(self) -> str:
        """The label key of the rental this record is about: its renter's.

        An end written by another task names the rental by its label.
        """
        named = label_key(self.record.get("label")) if self.end_only else None
        return named or lifecycle.rental_key(*self.ti_key)

    @property
    def end_only(self) -> bool:
        """Written by what destroyed the instance, not by its renter (``records.end_only``)."""
        return bool(self.record.get("end_only"))


@dataclass(frozen=True)
class TaskState:
    state: str | None
    end_date: float | None = None  # epoch seconds
    run_state: str | None = None


@dataclass
class LiveRental:
    conn_id: str
    instance_id: int
    status: str | None
    label: str | None
    offer_id: Any
    gpu_name: Any
    num_gpus: Any
    hourly_price: float | None
    uptime_seconds: float | None
    cost_so_far: float | None
    started_at: float | None = None  # the service's start_date
    recorded: RecordRow | None = None
    #: The task instance the instance belongs to: its record's, else the one its label's key names.
    owner: TiKey | None = None
    task_state: str | None = None
    orphan_reason: str | None = None
    #: What the service charged the instance over the window's days (``charge_live``); None: no charge.
    charged: Charged | None = None
    #: It started before the window's first day, so its charges are not its whole cost so far.
    started_before_window: bool = False
    #: What its disk bills per hour, from its task's record (None: no record says).
    disk_hourly: float | None = None
    #: The task instances that reached it as a service (``connect_service``).
    used_by: tuple[TiKey, ...] = ()

    @property
    def dag_id(self) -> str | None:
        return self.owner[0] if self.owner else None

    @property
    def billing_now(self) -> float | None:
        """Dollars per hour it bills now: price and disk while it runs, its disk alone otherwise (None: not known)."""
        if self.status == api.STATUS_RUNNING:
            return None if self.hourly_price is None else round(self.hourly_price + (self.disk_hourly or 0.0), 6)
        return self.disk_hourly

    @property
    def figure(self) -> Figure:
        """Its cost so far: charged, else estimated."""
        return Figure(dollars(self.cost_so_far), self.charged, self.started_before_window)

    @property
    def by_label(self) -> bool:
        """Its owner comes from its label alone (no record names it)."""
        return self.recorded is None and self.owner is not None


@dataclass(frozen=True)
class RentalSpend:
    """One rental of the window, with what it cost."""

    span: Span
    figure: Figure


@dataclass
class Spend:
    window_start: float
    window_end: float
    #: The window's rentals with a cost, newest first.
    rows: list[RentalSpend] = field(default_factory=list)
    dags: dict[str, Total] = field(default_factory=dict)
    runs: dict[tuple[str, str], Total] = field(default_factory=dict)
    #: day (YYYY-MM-DD, UTC) -> dag_id -> dollars: actual on the days charged, estimates on the rental's first day.
    per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Rentals that ended with no end recorded anywhere (destroyed outside Airflow) and no charge: not in the figures.
    unknown_cost: int = 0

    @property
    def per_dag(self) -> dict[str, float]:
        return {dag_id: float(total.amount) for dag_id, total in self.dags.items()}

    @property
    def per_run(self) -> dict[tuple[str, str], float]:
        return {run: float(total.amount) for run, total in self.runs.items()}

    @property
    def rentals(self) -> int:
        return len(self.rows)

    @property
    def actual(self) -> Decimal:
        return sum((t.actual for t in self.dags.values()), ZERO)

    @property
    def estimated(self) -> Decimal:
        return sum((t.estimated for t in self.dags.values()), ZERO)

    @property
    def amount(self) -> Decimal:
        return self.actual + self.estimated

    @property
    def total(self) -> float:
        return float(self.amount)


def hourly_price_of(instance: Mapping[str, Any], record: Mapping[str, Any] | None) -> float | None:
    """The bid of an interruptible instance, else its on-demand price; the record's when the service gives neither."""
    for value in (instance.get("bid_price") if instance.get("is_bid") else None, instance.get("dph_total")):
        if (price := number(value)) is not None:
            return price
    return price_of(record) if record else None


def _cost_so_far(
    price: float | None, start: float, record: Mapping[str, Any] | None, disk: float | None, now: float
) -> float | None:
    """Compute from when its task saw it run to when it saw it stop (else from its start, to now), disk throughout."""
    if record is None:
        return lifecycle.estimated_cost(price, max(0.0, now - start), digits=COST_DIGITS)
    return budgets.rental_cost(
        price,
        created_at=start,
        running_at=number(record.get("running_at")),
        stopped_at=number(record.get("stopped_at")),
        ended_at=now,
        disk_hourly=disk or 0.0,
        digits=COST_DIGITS,
    )


def label_key(label: Any) -> str | None:
    """The task instance key in a label this provider wrote (``lifecycle.rental_key``), else None."""
    parsed = lifecycle.parse_label(label)
    return parsed[0] if parsed else None


def records_of(instances: Iterable[tuple[str, Mapping[str, Any]]], starts: Iterable[RecordRow]) -> dict[int, RecordRow]:
    """Each listed instance's latest start record whose task its label names.

    Any record, for a label not the provider's. A simulator that was reset gives an id again, and an older rental's
    record is not this one's.
    """
    keys = {i["id"]: label_key(i.get("label")) for _, i in instances if isinstance(i.get("id"), int)}
    found: dict[int, RecordRow] = {}
    for row in sorted(starts, key=lambda r: number(r.record.get("created_at")) or 0):
        instance_id = row.record["instance_id"]
        if instance_id in keys and keys[instance_id] in (None, row.rental_key):
            found[instance_id] = row
    return found


def live_rentals(
    instances: Iterable[tuple[str, Mapping[str, Any]]],
    records: Mapping[int, RecordRow],  # from records_of
    tasks: Mapping[TiKey, TaskState],
    now: float,
    clock_offsets: Mapping[str, float] | None = None,
    attributed: Mapping[str, TiKey] | None = None,
) -> list[LiveRental]:
    """Every listed instance, newest first, with its owner, its task's state and any orphan reason.

    Instances come as ``(conn_id, instance)`` pairs. Uptime counts from the instance's ``start_date`` to the service's
    time (``now`` plus the connection's ``clock_offsets``, the service's clock minus this host's), or from its record's
    start when the service gives none.
    """
    rows = []
    for conn_id, instance in instances:
        if not isinstance(instance.get("id"), int):
            continue
        recorded = records.get(instance["id"])
        key = label_key(instance.get("label"))
        record = recorded.record if recorded else None
        service_now = now + (clock_offsets or {}).get(conn_id, 0.0)
        start = number(instance.get("start_date"))
        if start is None and record:
            start = number(record.get("created_at"))
        owner = recorded.ti_key if recorded else (attributed or {}).get(key or "")
        price = hourly_price_of(instance, record)
        disk = number(record.get("disk_hourly")) if record else None
        task = tasks.get(owner) if owner else None
        rows.append(
            LiveRental(
                conn_id=conn_id,
                instance_id=instance["id"],
                status=instance.get("actual_status"),
                label=instance.get("label"),
                offer_id=instance.get("offer_id", record.get("offer_id") if record else None),
                gpu_name=instance.get("gpu_name", record.get("gpu_name") if record else None),
                num_gpus=instance.get("num_gpus"),
                hourly_price=price,
                uptime_seconds=None if start is None else max(0.0, service_now - start),
                cost_so_far=None if start is None else _cost_so_far(price, start, record, disk, service_now),
                disk_hourly=disk,
                started_at=start,
                recorded=recorded,
                owner=owner,
                task_state=task.state if task else None,
                orphan_reason=orphan_reason(instance.get("label"), recorded, task, now, owner=owner),
            )
        )
    rows.sort(key=lambda r: (r.uptime_seconds is None, r.uptime_seconds or 0.0))
    return rows


def orphan_reason(
    label: Any, recorded: RecordRow | None, task: TaskState | None, now: float, owner: TiKey | None = None
) -> str | None:
    """Why a live instance is an orphan, or None.

    Only instances with this provider's label can be: one made by hand is nobody's business here. ``owner``: the task
    instance its label names, when no record does.
    """
    parsed = lifecycle.parse_label(label)
    if parsed is None:
        return None
    lease_until = parsed[1]
    if lease_until <= now:
        return f"its lease expired at {utc_text(lease_until)}"
    if recorded is None:
        if owner is None:
            return "no task recorded renting it, and its label names no task instance found"
        if task is not None and task.state in ACTIVE_TASK_STATES:
            return None
        return f"no task recorded renting it; its label names {ti_text(owner)}, which is {_state(task)}"
    if task is None:
        return "the task that rented it is gone (its run was deleted)"
    if recorded.record.get("handed_over"):
        if task.run_state not in ACTIVE_RUN_STATES:
            return f"it was handed to its DAG run, which is {task.run_state or 'gone'}"
        return None
    if task.state not in ACTIVE_TASK_STATES:
        return f"the task that rented it is {task.state or 'cleared'}"
    return None


def _state(task: TaskState | None) -> str:
    return "gone" if task is None else task.state or "cleared"


def ti_text(ti: TiKey) -> str:
    dag_id, run_id, task_id, map_index = ti
    return f"{dag_id} / {run_id} / {task_id}{'' if map_index < 0 else f'[{map_index}]'}"


@dataclass(frozen=True)
class Span:
    """One rental's life from all its records, on the service's clock."""

    instance_id: int
    owner: TiKey | None
    created_at: float | None
    hourly_price: float | None
    ended_at: float | None
    running_at: float | None = None  # first seen running: compute billing started by then
    stopped_at: float | None = None  # first seen stopped after its job: compute billing ended by then
    disk_hourly: float = 0.0  # what its disk bills per hour
    cost: float | None = None  # what its renter recorded at its end: ``cost_kind`` says whether charged or estimated
    cost_kind: str | None = None


def spans(rows: Iterable[RecordRow], attributed: Mapping[str, TiKey] | None = None) -> list[Span]:
    """One span per rental (instance id and label key).

    A span is owned by its renter's record, else by the task instance its label names; started as its earliest record
    says; ended at the first end any record gives.
    """
    groups: dict[tuple[int, str], list[RecordRow]] = defaultdict(list)
    for row in rows:
        groups[(row.record["instance_id"], row.rental_key)].append(row)
    result = []
    for (instance_id, key), group in groups.items():
        starts = sorted((r for r in group if not r.end_only), key=lambda r: number(r.record.get("created_at")) or 0)
        ordered = starts + [r for r in group if r.end_only]
        owner = starts[0].ti_key if starts else (attributed or {}).get(key)
        result.append(
            Span(
                instance_id=instance_id,
                owner=owner,
                created_at=next((t for r in ordered if (t := number(r.record.get("created_at"))) is not None), None),
                hourly_price=next((p for r in ordered if (p := price_of(r.record)) is not None), None),
                ended_at=min((t for r in group if (t := number(r.record.get("ended_at"))) is not None), default=None),
                running_at=min(
                    (t for r in group if (t := number(r.record.get("running_at"))) is not None), default=None
                ),
                stopped_at=min(
                    (t for r in group if (t := number(r.record.get("stopped_at"))) is not None), default=None
                ),
                disk_hourly=next((d for r in ordered if (d := number(r.record.get("disk_hourly")))), 0.0),
                cost=number(starts[0].record.get("cost")) if starts else None,
                cost_kind=starts[0].record.get("cost_kind") if starts else None,
            )
        )
    return result


def spend(
    rentals: Iterable[Span],
    alive_costs: Mapping[int, float | None],
    window_start: float,
    now: float,
    charges: Iterable[Charge] = (),
) -> Spend:
    """What the owned rentals created since ``window_start`` cost, per rental, per DAG, per run and per day and DAG.

    ``alive_costs``: the cost so far of each instance the service lists (its live row's figure). ``charges``: the
    service's charges (none when it gives none). An instance's charges go to its latest rental (a simulator that was
    reset gives an id again); a rental with none is estimated.
    """
    result = Spend(window_start=window_start, window_end=now)
    charges, rentals = list(charges), sorted(rentals, key=lambda s: s.created_at or 0.0)
    charged = instance_charges(charges, window_start)
    latest = {s.instance_id: s for s in rentals}
    took: dict[int, Span] = {}  # instance id -> the rental its charges went to
    per_day: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for span in reversed(rentals):
        if span.owner is None or span.created_at is None or span.created_at < window_start:
            continue
        estimate = span_cost(span, alive_costs)
        listed = charged.get(span.instance_id) if latest[span.instance_id] is span else None
        its_charges = listed or recorded_charge(span)
        if estimate is None and its_charges is None:
            result.unknown_cost += 1
            continue
        figure = Figure(dollars(estimate), its_charges)
        dag_id, run_id = span.owner[0], span.owner[1]
        result.rows.append(RentalSpend(span, figure))
        result.dags.setdefault(dag_id, Total()).add(figure)
        result.runs.setdefault((dag_id, run_id), Total()).add(figure)
        if listed is None:
            per_day[spend_report.utc_day(span.created_at)][dag_id] += figure.amount or ZERO
        else:
            took[span.instance_id] = span
    first = day_start(window_start)
    for charge in charges:  # an actual counts on the days the service charged it
        taker = took.get(charge.instance_id) if charge.instance_id is not None else None
        when = charge_time(charge)
        if taker is None or taker.owner is None or (when is not None and when < first):
            continue
        day = spend_report.utc_day(when if when is not None else taker.created_at or first)
        per_day[day][taker.owner[0]] += dollars(charge.amount) or ZERO
    result.per_day = {day: {d: float(v) for d, v in dags.items()} for day, dags in sorted(per_day.items())}
    return result


def recorded_charge(span: Span) -> Charged | None:
    """The service's charge its renter read at the rental's end, when the window's charges do not list it."""
    if span.cost is None or span.cost_kind != budgets.CHARGED:
        return None
    return Charged(dollars(span.cost) or ZERO, span.ended_at)


def charge_live(rows: Iterable[LiveRental], charges: Iterable[Charge], window_start: float) -> None:
    """Set each live row's charges over the window's days, and whether it started before the window's first day."""
    charged = instance_charges(charges, window_start)
    for row in rows:
        row.charged = charged.get(row.instance_id)
        row.started_before_window = row.started_at is not None and row.started_at < day_start(window_start)


def span_cost(span: Span, alive_costs: Mapping[int, float | None]) -> float | None:
    """A span's cost, or None when unknown.

    Ended: its renter's recorded estimate, else ``budgets.rental_cost``. Still listed: its live row's cost so far.
    Gone with no end recorded: unknown (None), never guessed from its task's end.
    """
    if span.ended_at is not None and span.cost is not None and span.cost_kind == budgets.ESTIMATED:
        return span.cost  # its renter's estimate, the one its task log and its budget settled at
    if span.ended_at is not None:
        return budgets.rental_cost(
            span.hourly_price,
            created_at=span.created_at,
            running_at=span.running_at,
            stopped_at=span.stopped_at,
            ended_at=span.ended_at,
            disk_hourly=span.disk_hourly,
            digits=COST_DIGITS,
        )
    return alive_costs.get(span.instance_id)


utc_text = spend_report.utc_time
