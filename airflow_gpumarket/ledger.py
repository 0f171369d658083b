"""The budget ledger: one row per rental's reservation, in the Airflow metadata database.

A reservation is made in one transaction that first writes the ledger's lock row: PostgreSQL and MySQL then hold that
row's lock, SQLite its database's write lock, until the transaction ends. So two tasks (on two workers, under two
schedulers) never both read the same total and both take the last dollars. This module runs where the metadata
database may be used: in the task on Airflow 2, in the api-server on Airflow 3 (``ui/ledger_api.py``). The budgets
that apply are read here too, from the Variable, never taken from the task's request.

Each reservation carries an idempotency key (``Request.key``: the task try and its rental attempt), unique in the
table: a repeated request answers the reservation it made, and never reserves twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    func,
    inspect,
    or_,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from airflow_gpumarket import budgets, columns, signing

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
    Column("attempt", Integer),  # the rental attempt of the try: 1, 2, ... (null in rows of earlier versions)
    Column("idempotency_key", String(64)),  # ``Request.key``
    Index("idx_gpumarket_reservation_dag", "dag_id", "created_at"),
    Index("idx_gpumarket_reservation_instance", "instance_id"),
    Index("idx_gpumarket_reservation_key", "idempotency_key", unique=True),
)
#: The nonces of signed ledger requests seen within the signature's window (``signing.MAX_AGE_SECONDS``).
NONCES = Table(
    "gpumarket_ledger_nonce",
    metadata,
    Column("nonce", String(64), primary_key=True),
    Column("stamp", Float, nullable=False),  # the request's signed timestamp: the nonce is kept while it is valid
    Index("idx_gpumarket_ledger_nonce_stamp", "stamp"),
)
#: The one lock row every reservation takes.
LOCK_NAME = "budgets"

_ready: set[str] = set()
_ready_lock = threading.Lock()


class BudgetRefused(Exception):
    """The rental does not fit a budget or the account's credit, or its budget is malformed; the message says which."""


class Unknown(LookupError):
    """The connection has no reservation of that id."""


class Settled(Exception):
    """The reservation is settled: it is final."""


@dataclass(frozen=True)
class Reservation:
    """A reservation's id, and the budgets it was checked against with the warnings their Variable gave.

    A repeated request answers its reservation's id alone: nothing was checked again.
    """

    id: int
    limits: budgets.Limits | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        limits = None if self.limits is None else self.limits.to_json()
        return {"id": self.id, "limits": limits, "warnings": self.warnings}

    @classmethod
    def from_json(cls, body: Any) -> Reservation:
        limits = body.get("limits")
        return cls(
            int(body["id"]),
            None if limits is None else budgets.Limits.from_json(limits, "limits"),
            [str(w) for w in body.get("warnings") or ()],
        )


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
    attempt: int = 1  # the try's rental attempt (each create reserves once)
    available: float | None = None  # the account's credit, when read
    team: str | None = None  # the DAG's team tag (``budgets.team_of``)
    started: float | None = None  # the service's time just before the create

    @property
    def key(self) -> str:
        """The idempotency key: one per rental attempt of a task try, on one connection."""
        parts = [self.conn_id, self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number, self.attempt]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def __post_init__(self) -> None:
        """A request's amounts are finite and not negative, wherever it was made: no row can hold NaN."""
        columns.finite("worst", self.worst, high=columns.MAX_DOLLARS)
        columns.finite("seconds", self.seconds, high=columns.MAX_SECONDS)
        columns.finite("hourly", self.hourly, high=columns.MAX_DOLLARS)
        if self.started is not None:
            columns.finite("started", self.started, high=columns.MAX_EPOCH)
        if self.available is not None:
            columns.finite("available", self.available, low=-columns.MAX_DOLLARS, high=columns.MAX_DOLLARS)

    @classmethod
    def from_json(cls, body: Any) -> Request:
        """Raises ValueError naming the field that is missing, of the wrong type or out of range."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return cls(  # a "limits" field (sent by earlier versions) is ignored: the Variable says
            conn_id=columns.text(body, "conn_id"),
            dag_id=columns.text(body, "dag_id"),
            run_id=columns.text(body, "run_id"),
            task_id=columns.text(body, "task_id"),
            map_index=columns.integer(body, "map_index", low=-1, high=columns.INT32),
            try_number=columns.integer(body, "try_number", low=0, high=columns.INT32),
            attempt=columns.integer(body, "attempt", low=1, high=columns.INT32),
            worst=columns.number(body, "worst"),
            seconds=columns.number(body, "seconds", high=columns.MAX_SECONDS),
            hourly=columns.number(body, "hourly"),
            # A credit below $0: storage bills on after the service's stop.
            available=columns.number(body, "available", low=-columns.MAX_DOLLARS, required=False),
            team=columns.text(body, "team", required=False),
            started=columns.number(body, "started", high=columns.MAX_EPOCH, required=False),
        )


#: Passes over a creation step that other processes may run at the same time.
DDL_PASSES = 5


def create_racing(step: Callable[[], Any], passes: int = DDL_PASSES) -> None:
    """Run a step that creates tables or indexes while other processes may create them too: a pass that fails on what
    another made between its check and its create is run again, and a later pass finds it made."""
    for done in range(1, passes + 1):
        try:
            step()
            return
        except (OperationalError, ProgrammingError, IntegrityError):
            if done == passes:
                raise
            time.sleep(0.05 * done)  # the other process's transaction commits meanwhile


def ensure_tables(engine: Any) -> None:
    """Create the ledger's tables and lock row when missing, and add what an earlier version's table lacks (once per
    process and database)."""
    url = str(engine.url)
    with _ready_lock:
        if url in _ready:
            return
        create_racing(lambda: metadata.create_all(engine, checkfirst=True))
        create_racing(lambda: _add_idempotency_key(engine))
        try:
            with engine.begin() as conn:
                if conn.execute(select(LOCKS.c.name).where(LOCKS.c.name == LOCK_NAME)).first() is None:
                    conn.execute(LOCKS.insert().values(name=LOCK_NAME, version=0))
        except IntegrityError:
            pass  # inserted by another process meanwhile
        _ready.add(url)


def _add_idempotency_key(engine: Any) -> None:
    """A reservations table made before the idempotency key gets its columns and unique index (null in old rows,
    which a unique index lets any number of rows share)."""
    r = RESERVATIONS
    have = {column["name"] for column in inspect(engine).get_columns(r.name)}
    with engine.begin() as conn:
        for column in (r.c.attempt, r.c.idempotency_key):
            if column.name not in have:
                kind = column.type.compile(dialect=engine.dialect)
                conn.execute(text(f"ALTER TABLE {r.name} ADD COLUMN {column.name} {kind}"))
    (index,) = (index for index in r.indexes if index.unique)
    if index.name not in {found["name"] for found in inspect(engine).get_indexes(r.name)}:
        index.create(engine)


def dag_budgets(dag_id: str, raw: Any) -> tuple[budgets.Limits | None, list[str]]:
    """The DAG's budgets in the Variable's value ``raw``, and the warnings of entries skipped for other DAGs.

    Raises ``BudgetRefused`` naming the key when the Variable, or the entry that applies to the DAG, is malformed.
    """
    try:
        return budgets.limits_of(raw, dag_id)
    except budgets.BudgetConfigError as exc:
        raise BudgetRefused(f"{exc}. Nothing was rented.") from None


def budgets_variable() -> Any:
    """The budgets Variable's value: the api-server's read, the task's, or the command line's."""
    from airflow_gpumarket._compat import get_variable

    return get_variable(budgets.VARIABLE)


def reserve(engine: Any, request: Request, *, now: float) -> Reservation:
    """Reserve the request's worst case against the DAG's budgets in the Variable, or answer the reservation its key
    made already. Raises ``BudgetRefused``, reserving nothing."""
    ensure_tables(engine)
    r = RESERVATIONS
    key = request.key
    with engine.begin() as conn:
        made = _reservation_of(conn, key)
    if made is not None:
        return Reservation(made)
    # the Variable is read before the lock: a secrets backend may be slow
    limits, warnings = dag_budgets(request.dag_id, budgets_variable())
    since = budgets.earliest_window_start(now)
    try:
        with engine.begin() as conn:
            conn.execute(LOCKS.update().where(LOCKS.c.name == LOCK_NAME).values(version=LOCKS.c.version + 1))
            made = _reservation_of(conn, key)
            if made is not None:  # the same request, answered while this one waited for the lock
                return Reservation(made)
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
                limits,
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
                    attempt=request.attempt,
                    idempotency_key=key,
                    reserved=request.worst,
                    hourly=request.hourly,
                    created_at=now,
                    started=request.started,
                    until=now + request.seconds,
                )
            )
            return Reservation(int(result.inserted_primary_key[0]), limits, warnings)
    except IntegrityError:
        with engine.begin() as conn:
            made = _reservation_of(conn, key)  # the unique index caught a twin the lock did not serialise
        if made is None:
            raise
        return Reservation(made)


def _reservation_of(conn: Any, key: str) -> int | None:
    """The id of the reservation the idempotency key made, or None."""
    made = conn.execute(select(RESERVATIONS.c.id).where(RESERVATIONS.c.idempotency_key == key)).scalar()
    return None if made is None else int(made)


def last_attempt(
    engine: Any, *, conn_id: str, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int
) -> int:
    """The highest rental attempt the task try has reserved for (0: none), so that a resumed task numbers on."""
    ensure_tables(engine)
    r = RESERVATIONS
    with engine.begin() as conn:
        last = conn.execute(
            select(func.max(r.c.attempt)).where(
                r.c.conn_id == conn_id,
                r.c.dag_id == dag_id,
                r.c.run_id == run_id,
                r.c.task_id == task_id,
                r.c.map_index == map_index,
                r.c.try_number == try_number,
            )
        ).scalar()
    return int(last or 0)


def attach(engine: Any, conn_id: str, reservation_id: int, instance_id: int) -> None:
    """Name the instance a reservation pays for, so that whatever destroys it settles the reservation.

    Raises ``Unknown`` when the connection has no such reservation, ``Settled`` when it is settled (a settled
    reservation is final: it is not pointed at another instance); either changes nothing.
    """
    ensure_tables(engine)
    r = RESERVATIONS
    mine = and_(r.c.id == reservation_id, r.c.conn_id == conn_id)
    with engine.begin() as conn:
        if conn.execute(r.update().where(mine, r.c.cost.is_(None)).values(instance_id=instance_id)).rowcount:
            return
        row = conn.execute(select(r.c.cost, r.c.instance_id).where(mine)).first()
    if row is None:
        raise Unknown(f"connection {conn_id!r} has no reservation {reservation_id}")
    if row.cost is None:
        return  # open, and named that instance already (MySQL counts the rows an update changed)
    raise Settled(
        f"reservation {reservation_id} was settled at ${row.cost:.4f} (instance {row.instance_id}); a settled "
        f"reservation is final, so it is not attached to instance {instance_id}"
    )


def settle(
    engine: Any,
    conn_id: str,
    *,
    now: float,
    reservation_id: int | None = None,
    instance_id: int | None = None,
    ended: float | None = None,
    cost: float | None = None,
) -> float | None:
    """The rental ended now: its open reservation becomes what it cost (nothing when no instance was made).

    The cost is ``cost`` when its task knows it (the service's charge, else its estimate: ``operators.cost``); else
    its hourly price, disk included, from just before the create to its end, on the service's clock when both ends
    are known (``started``, ``ended``), else on this one's. Returns it (the cost it was settled at, when it was
    already), or None when no reservation matched.
    """
    if ended is not None:
        columns.finite("ended", ended, high=columns.MAX_EPOCH)
    if cost is not None:
        columns.finite("cost", cost, high=columns.MAX_DOLLARS)
    ensure_tables(engine)
    r = RESERVATIONS
    match = r.c.id == reservation_id if reservation_id is not None else r.c.instance_id == instance_id
    with engine.begin() as conn:
        row = conn.execute(
            select(r.c.id, r.c.hourly, r.c.created_at, r.c.started, r.c.instance_id, r.c.cost)
            .where(match, r.c.conn_id == conn_id)
            .order_by(r.c.cost.is_not(None), r.c.id.desc())  # the open one first
        ).first()
        if row is None:
            return None
        if row.cost is not None:
            return float(row.cost)  # settled once: a repeated settle changes nothing
        if row.instance_id is None:
            cost = 0.0
        elif cost is None:
            seconds = ended - row.started if ended is not None and row.started is not None else now - row.created_at
            cost = min(row.hourly * max(0.0, seconds) / 3600.0, columns.MAX_DOLLARS)
        cost = budgets.round_up(cost)
        conn.execute(r.update().where(r.c.id == row.id, r.c.cost.is_(None)).values(cost=cost, settled_at=now))
    return cost


def first_use(engine: Any, nonce: str, *, stamp: float, now: float) -> bool:
    """Record a signed request's nonce; False when it was recorded before (a replay within the signature's window).

    Nonces are kept while their request's timestamp is accepted, then purged.
    """
    ensure_tables(engine)
    try:
        with engine.begin() as conn:
            conn.execute(NONCES.insert().values(nonce=nonce, stamp=stamp))
    except IntegrityError:
        return False
    try:
        with engine.begin() as conn:
            conn.execute(NONCES.delete().where(NONCES.c.stamp < now - signing.MAX_AGE_SECONDS))
    except OperationalError:
        pass  # a purge that met another one's locks: the next request purges
    return True


def entries(engine: Any, *, since: float, conn_id: str | None = None) -> list[dict[str, Any]]:
    """Every reservation made since ``since`` (of one connection, when given), oldest first, as plain dicts."""
    ensure_tables(engine)
    r = RESERVATIONS
    match = r.c.created_at >= since if conn_id is None else and_(r.c.created_at >= since, r.c.conn_id == conn_id)
    with engine.begin() as conn:
        rows = conn.execute(select(r).where(match).order_by(r.c.id)).all()
    return [dict(row._mapping) for row in rows]


def _entry(row: Any) -> budgets.Entry:
    return entry_of(row._mapping)


def entry_of(record: Mapping[str, Any]) -> budgets.Entry:
    """A reservation (a row, or a dict of ``entries``) as the budget check sees it."""
    open_ = record["cost"] is None
    return budgets.Entry(
        dag_id=record["dag_id"],
        run_id=record["run_id"],
        created_at=float(record["created_at"]),
        amount=float(record["reserved"] if open_ else record["cost"]),
        open=open_,
        conn_id=record["conn_id"],
        until=float(record["until"]) if record.get("until") is not None else math.inf,
    )
