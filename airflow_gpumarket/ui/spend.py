"""The GPU rentals page's data, from plain inputs: the service's instances, the renting tasks' records, and the
states of those tasks and their runs. No I/O here (``sources.py`` reads; ``page.py`` renders), so every rule of
the page is unit-tested.

- **Live rentals**: every instance the service lists, matched to the DAG, run, task and try that recorded it.
- **Orphans**: live instances with this provider's label whose lease expired, that no task recorded, or whose task
  no longer runs (for ``GpuMarketCreateInstanceOperator``, which hands its instance to later tasks: whose DAG run
  no longer runs).
- **Spend**: per DAG, per DAG run and per day and DAG, from the records of rentals created in the window. A rental
  counts on the day it was created, at what its record says it cost (or, still open, at its hourly price so far).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui.records import COST_DIGITS, price_of

#: Task instance states in which a renting task still holds (or is about to hold) its rental.
ACTIVE_TASK_STATES = frozenset(
    {"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: DAG run states in which a handed-over instance is still in use.
ACTIVE_RUN_STATES = frozenset({"queued", "running"})


@dataclass(frozen=True)
class RecordRow:
    """One rental record, with the task instance that wrote it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    record: Mapping[str, Any]

    @property
    def ti_key(self) -> tuple[str, str, str, int]:
        return self.dag_id, self.run_id, self.task_id, self.map_index


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
    recorded: RecordRow | None = None
    task_state: str | None = None
    orphan_reason: str | None = None

    @property
    def dag_id(self) -> str | None:
        return self.recorded.dag_id if self.recorded else None


@dataclass
class Spend:
    window_start: float
    window_end: float
    per_dag: dict[str, float] = field(default_factory=dict)
    per_run: dict[tuple[str, str], float] = field(default_factory=dict)
    #: day (YYYY-MM-DD, UTC) -> dag_id -> dollars
    per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    rentals: int = 0

    @property
    def total(self) -> float:
        return round(sum(self.per_dag.values()), 6)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def hourly_price_of(instance: Mapping[str, Any], record: Mapping[str, Any] | None) -> float | None:
    """The bid of an interruptible instance, else its on-demand price; the record's when the service gives neither."""
    for value in (instance.get("bid_price") if instance.get("is_bid") else None, instance.get("dph_total")):
        if (price := _number(value)) is not None:
            return price
    return price_of(record) if record else None


def live_rentals(
    instances: Iterable[tuple[str, Mapping[str, Any]]],
    records: Mapping[int, RecordRow],
    tasks: Mapping[tuple[str, str, str, int], TaskState],
    now: float,
    clock_offsets: Mapping[str, float] | None = None,
) -> list[LiveRental]:
    """Every listed instance (``(conn_id, instance)`` pairs), newest first, with its task and, if it is one, why
    it is an orphan. Uptime counts from the instance's ``start_date`` to the service's time (``now`` plus the
    connection's ``clock_offsets``, the service's clock minus this host's), or from the task's record to ``now``
    when the service gives no start."""
    rows = []
    for conn_id, instance in instances:
        if not isinstance(instance.get("id"), int):
            continue
        recorded = records.get(instance["id"])
        record = recorded.record if recorded else None
        start, until = _number(instance.get("start_date")), now + (clock_offsets or {}).get(conn_id, 0.0)
        if start is None:
            start, until = (_number(record.get("created_at")) if record else None), now
        price = hourly_price_of(instance, record)
        task = tasks.get(recorded.ti_key) if recorded else None
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
                uptime_seconds=None if start is None else max(0.0, until - start),
                cost_so_far=None
                if start is None
                else lifecycle.estimated_cost(price, until - start, digits=COST_DIGITS),
                recorded=recorded,
                task_state=task.state if task else None,
                orphan_reason=orphan_reason(instance.get("label"), recorded, task, now),
            )
        )
    rows.sort(key=lambda r: (r.uptime_seconds is None, r.uptime_seconds or 0.0))
    return rows


def orphan_reason(label: Any, recorded: RecordRow | None, task: TaskState | None, now: float) -> str | None:
    """Why a live instance is an orphan, or None. Only instances with this provider's label can be: one made by
    hand is nobody's business here."""
    parsed = lifecycle.parse_label(label)
    if parsed is None:
        return None
    lease_until = parsed[1]
    if lease_until <= now:
        return f"its lease expired at {utc_text(lease_until)}"
    if recorded is None:
        return "no task recorded renting it"
    if task is None:
        return "the task that rented it is gone (its run was deleted)"
    if recorded.record.get("handed_over"):
        if task.run_state not in ACTIVE_RUN_STATES:
            return f"it was handed to its DAG run, which is {task.run_state or 'gone'}"
        return None
    if task.state not in ACTIVE_TASK_STATES:
        return f"the task that rented it is {task.state or 'cleared'}"
    return None


def spend(
    records: Iterable[RecordRow],
    tasks: Mapping[tuple[str, str, str, int], TaskState],
    alive_costs: Mapping[int, float | None],
    window_start: float,
    now: float,
) -> Spend:
    """What the rentals created in ``[window_start, now]`` cost, per DAG, per run and per day and DAG.
    ``alive_costs``: the cost so far of each instance the service lists (its live row's figure)."""
    result = Spend(window_start=window_start, window_end=now)
    per_day: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in records:
        created = _number(row.record.get("created_at"))
        if created is None or not window_start <= created <= now:
            continue
        cost = rental_cost(row, tasks.get(row.ti_key), alive_costs, now)
        if cost is None:
            continue
        result.rentals += 1
        result.per_dag[row.dag_id] = round(result.per_dag.get(row.dag_id, 0.0) + cost, 6)
        run = (row.dag_id, row.run_id)
        result.per_run[run] = round(result.per_run.get(run, 0.0) + cost, 6)
        per_day[_day(created)][row.dag_id] += cost
    result.per_day = {day: {d: round(v, 6) for d, v in dags.items()} for day, dags in sorted(per_day.items())}
    return result


def rental_cost(
    row: RecordRow, task: TaskState | None, alive_costs: Mapping[int, float | None], now: float
) -> float | None:
    """The record's cost once ended; still open: its live row's cost so far if the service lists the instance, else
    at its hourly price until its task ended (the task was stopped before it could write the end, e.g. killed) or
    until now."""
    cost = _number(row.record.get("cost"))
    if cost is not None:
        return cost
    instance_id = row.record.get("instance_id")
    live_cost = alive_costs.get(instance_id) if isinstance(instance_id, int) else None
    if live_cost is not None:
        return live_cost
    created = _number(row.record.get("created_at"))
    if created is None:
        return None
    end = now if instance_id in alive_costs or task is None or task.end_date is None else task.end_date
    return lifecycle.estimated_cost(price_of(row.record), end - created, digits=COST_DIGITS)


def _day(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d")


def utc_text(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
