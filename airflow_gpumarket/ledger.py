"""The budget ledger: one row per rental's reservation, in the Airflow metadata database.

A reservation is made in one transaction that first writes the ledger's lock row: PostgreSQL and MySQL then hold that
row's lock, SQLite its database's write lock, until the transaction ends. So two tasks (on two workers, under two
schedulers) never both read the same total and both take the last dollars. This module runs where the metadata
database may be used: in the task on Airflow 2, in the api-server on Airflow 3 (``ui/ledger_api.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    and_,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from airflow_gpumarket import budgets

metadata = MetaData()

LOCKS = Table(
    "gpumarket_budget_lock",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("version", BigInteger, nullable=False),
)
RESERVATIONS = Table(
    "gpumarket_reservation",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("conn_id", String(250), nullable=False),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("task_id", String(250), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("team", String(250)),
    Column("try_number", Integer, nullable=False),
    Column("instance_id", BigInteger),
    Column("reserved", Float, nullable=False),
    Column("hourly", Float, nullable=False),
    Column("cost", Float),
    Column("created_at", Float, nullable=False),
    Column("started", Float),  # the service's time just before the create: its bill counts from there
    Column("until", Float, nullable=False),
    Column("settled_at", Float),
    Index("idx_gpumarket_reservation_dag", "dag_id", "created_at"),
    Index("idx_gpumarket_reservation_instance", "instance_id"),
)
#: The one lock row every reservation takes.
LOCK_NAME = "budgets"

_ready: set[str] = set()
_ready_lock = threading.Lock()


class BudgetRefused(Exception):
    """The rental does not fit a budget or the account's credit; the message says which and by how much."""


@dataclass(frozen=True)
class Request:
    """A reservation asked for by a task about to rent."""

    conn_id: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    worst: float  # dollars
    seconds: float  # how long the rental may bill at most
    hourly: float  # what it bills per hour, disk included
    limits: budgets.Limits | None = None
    available: float | None = None  # the account's credit, when read
    team: str | None = None  # the DAG's team tag (``budgets.team_of``)
    started: float | None = None  # the service's time just before the create

    def to_json(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "limits"}
        return {**body, "limits": None if self.limits is None else self.limits.to_json()}

    @classmethod
    def from_json(cls, body: Any) -> Request:
        """Raises ValueError naming the field that is missing or of the wrong type."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        fields: dict[str, Any] = {}
        for name, kind in (("conn_id", str), ("dag_id", str), ("run_id", str), ("task_id", str)):
            if not isinstance(body.get(name), kind) or not body[name]:
                raise ValueError(f"{name} must be a non-empty string")
            fields[name] = body[name]
        for name in ("map_index", "try_number"):
            if isinstance(body.get(name), bool) or not isinstance(body.get(name), int):
                raise ValueError(f"{name} must be an integer")
            fields[name] = body[name]
        for name in ("worst", "seconds", "hourly", "available", "started"):
            value = body.get(name)
            if value is None and name in ("available", "started"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number")
            if value < 0 and name != "available":  # a credit below $0: storage bills on after the service's stop
                raise ValueError(f"{name} must be a number >= 0")
            fields[name] = float(value)
        if body.get("team") is not None:
            if not isinstance(body["team"], str):
                raise ValueError("team must be a string or null")
            fields["team"] = body["team"]
        limits = body.get("limits")
        fields["limits"] = None if limits is None else budgets.Limits.from_json(limits, "limits")
        return cls(**fields)


def ensure_tables(engine: Any) -> None:
    """Create the ledger's tables and lock row when missing (once per process and database)."""
    url = str(engine.url)
    with _ready_lock:
        if url in _ready:
            return
        try:
            metadata.create_all(engine, checkfirst=True)
        except (OperationalError, ProgrammingError, IntegrityError):
            metadata.create_all(engine, checkfirst=True)  # another process created them between check and create
        try:
            with engine.begin() as conn:
                if conn.execute(select(LOCKS.c.name).where(LOCKS.c.name == LOCK_NAME)).first() is None:
                    conn.execute(LOCKS.insert().values(name=LOCK_NAME, version=0))
        except IntegrityError:
            pass  # inserted by another process meanwhile
        _ready.add(url)


def reserve(engine: Any, request: Request, *, now: float) -> int:
    """Reserve the request's worst case; its reservation's id. Raises ``BudgetRefused``, reserving nothing."""
    ensure_tables(engine)
    r = RESERVATIONS
    since = min(budgets.window_starts(now).values())
    with engine.begin() as conn:
        conn.execute(LOCKS.update().where(LOCKS.c.name == LOCK_NAME).values(version=LOCKS.c.version + 1))
        rows = conn.execute(
            select(r.c.dag_id, r.c.run_id, r.c.created_at, r.c.reserved, r.c.cost, r.c.conn_id, r.c.until).where(
                or_(
                    and_(r.c.dag_id == request.dag_id, or_(r.c.created_at >= since, r.c.run_id == request.run_id)),
                    and_(r.c.conn_id == request.conn_id, r.c.cost.is_(None), r.c.until > now),
                )
            )
        ).all()
        entries = [_entry(row) for row in rows]
        totals = budgets.used(entries, dag_id=request.dag_id, run_id=request.run_id, now=now)
        why = budgets.refusal(
            request.limits,
            totals,
            request.worst,
            dag_id=request.dag_id,
            available=request.available,
            held=budgets.held(entries, conn_id=request.conn_id, now=now),
        )
        if why is not None:
            raise BudgetRefused(why)
        result = conn.execute(
            r.insert().values(
                conn_id=request.conn_id,
                dag_id=request.dag_id,
                run_id=request.run_id,
                task_id=request.task_id,
                map_index=request.map_index,
                team=request.team,
                try_number=request.try_number,
                reserved=request.worst,
                hourly=request.hourly,
                created_at=now,
                started=request.started,
                until=now + request.seconds,
            )
        )
        return int(result.inserted_primary_key[0])


def attach(engine: Any, conn_id: str, reservation_id: int, instance_id: int) -> None:
    """Name the instance a reservation pays for, so that whatever destroys it settles the reservation."""
    ensure_tables(engine)
    r = RESERVATIONS
    with engine.begin() as conn:
        conn.execute(r.update().where(r.c.id == reservation_id, r.c.conn_id == conn_id).values(instance_id=instance_id))


def settle(
    engine: Any,
    conn_id: str,
    *,
    now: float,
    reservation_id: int | None = None,
    instance_id: int | None = None,
    ended: float | None = None,
) -> float | None:
    """The rental ended now: its open reservation becomes what it cost (nothing when no instance was made).

    The cost is its hourly price, disk included, from just before the create to its end, on the service's clock when
    both ends are known (``started``, ``ended``), else on this one's. Returns it, or None when no open reservation
    matched.
    """
    ensure_tables(engine)
    r = RESERVATIONS
    match = r.c.id == reservation_id if reservation_id is not None else r.c.instance_id == instance_id
    with engine.begin() as conn:
        row = conn.execute(
            select(r.c.id, r.c.hourly, r.c.created_at, r.c.started, r.c.instance_id).where(
                match, r.c.conn_id == conn_id, r.c.cost.is_(None)
            )
        ).first()
        if row is None:
            return None
        seconds = ended - row.started if ended is not None and row.started is not None else now - row.created_at
        cost = 0.0 if row.instance_id is None else row.hourly * max(0.0, seconds) / 3600.0
        cost = budgets.round_up(cost)
        conn.execute(r.update().where(r.c.id == row.id).values(cost=cost, settled_at=now))
    return cost


def entries(engine: Any, *, since: float, conn_id: str | None = None) -> list[dict[str, Any]]:
    """Every reservation made since ``since`` (of one connection, when given), oldest first, as plain dicts."""
    ensure_tables(engine)
    r = RESERVATIONS
    match = r.c.created_at >= since if conn_id is None else and_(r.c.created_at >= since, r.c.conn_id == conn_id)
    with engine.begin() as conn:
        rows = conn.execute(select(r).where(match).order_by(r.c.id)).all()
    return [dict(row._mapping) for row in rows]


def _entry(row: Any) -> budgets.Entry:
    open_ = row.cost is None
    return budgets.Entry(
        dag_id=row.dag_id,
        run_id=row.run_id,
        created_at=row.created_at,
        amount=float(row.reserved if open_ else row.cost),
        open=open_,
        conn_id=row.conn_id,
        until=row.until,
    )
