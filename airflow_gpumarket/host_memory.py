"""Host memory: machines that failed a rental, kept in the Airflow metadata database for a while, per account.

A machine is remembered when it failed a preflight, never booted within ``boot_timeout``, ended in ``exited``,
``unknown`` or ``offline``, was lost mid-job, or its service never became ready; every renting task of the same
account then skips it until the memory expires (``DEFAULT_TTL_SECONDS`` unless told). The account is a digest of
the connection's API key (``account_of``), so two connections with one key share the memory and the key itself is
never stored. Like the budget ledger (``ledger.py``) this module runs where the metadata database may be used: in
the task on Airflow 2, in the api-server on Airflow 3 (``ui/host_memory_api.py``). One machine is one row, written
by one statement per transaction: concurrent writers on SQLite or PostgreSQL either update it or insert it, and a
lost insert race turns into an update.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, String, Table, and_, delete, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from airflow_gpumarket import columns
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ledger import create_racing

#: How long a machine is avoided after it failed, unless told otherwise.
DEFAULT_TTL_SECONDS = 24 * 3600.0
#: Why a machine is remembered.
REASONS = ("preflight", "boot_timeout", "exited", "unknown", "offline", "lost", "not_ready")
#: Characters of a reason's detail kept.
DETAIL_CHARS = 500

metadata = MetaData()
HOSTS = Table(
    "gpumarket_host_memory",
    metadata,
    Column("account", String(64), primary_key=True),
    Column("machine_id", BigInteger, primary_key=True, autoincrement=False),
    Column("reason", String(32), nullable=False),
    Column("detail", String(DETAIL_CHARS), nullable=False),
    Column("remembered_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("failures", Integer, nullable=False),
)

_ready: set[str] = set()
_ready_lock = threading.Lock()


def account_of(api_key: str) -> str:
    """The account a memory belongs to: a digest of the connection's API key (the key is never stored)."""
    return hashlib.sha256(f"gpumarket-host-memory:{api_key}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Memory:
    """A remembered machine: why, since when, until when, and how many failures it has had since it was cleared."""

    machine_id: int
    reason: str
    detail: str
    remembered_at: float
    expires_at: float
    failures: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> Memory:
        return cls(
            int(body["machine_id"]),
            str(body["reason"]),
            str(body["detail"]),
            float(body["remembered_at"]),
            float(body["expires_at"]),
            int(body["failures"]),
        )


def check_machine_id(machine_id: Any) -> int:
    """``machine_id`` as an int; GpuMarketValidationError when it is not a positive integer."""
    if isinstance(machine_id, bool) or not isinstance(machine_id, int) or not 0 < machine_id <= columns.INT64:
        raise GpuMarketValidationError(
            "machine_id", f"must be a positive integer (the offer's machine_id), got {machine_id!r}"
        )
    return machine_id


def check_ttl(ttl: Any) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= columns.MAX_SECONDS:
        raise GpuMarketValidationError("ttl_seconds", f"must be a number of seconds > 0 and <= 1e9, got {ttl!r}")
    return float(ttl)


def check_reason(reason: Any) -> str:
    if reason not in REASONS:
        raise GpuMarketValidationError("reason", f"must be one of {', '.join(REASONS)}, got {reason!r}")
    return str(reason)


def ensure_table(engine: Any) -> None:
    """Create the table when missing (once per process and database)."""
    url = str(engine.url)
    with _ready_lock:
        if url in _ready:
            return
        create_racing(lambda: metadata.create_all(engine, checkfirst=True))
        _ready.add(url)


def remember(
    engine: Any,
    account: str,
    machine_id: int,
    reason: str,
    *,
    now: float,
    ttl: float = DEFAULT_TTL_SECONDS,
    detail: str = "",
) -> Memory:
    """Remember that ``machine_id`` failed for ``reason`` at ``now``, for ``ttl`` seconds from now.

    A machine remembered already keeps its first time, counts one more failure and is avoided until the later of
    the two expiries.
    """
    machine_id, reason, ttl = check_machine_id(machine_id), check_reason(reason), check_ttl(ttl)
    ensure_table(engine)
    h, detail, expires = HOSTS, str(detail)[:DETAIL_CHARS], now + ttl
    mine = and_(h.c.account == account, h.c.machine_id == machine_id)
    for _ in range(3):
        with engine.begin() as conn:
            row = conn.execute(select(h).where(mine)).first()
            if row is not None:
                changes: dict[str, Any] = (
                    {"failures": h.c.failures + 1, "expires_at": max(row.expires_at, expires)}
                    if row.expires_at > now
                    else {"failures": 1, "expires_at": expires, "remembered_at": now}  # expired: a new memory
                )
                conn.execute(update(h).where(mine).values(reason=reason, detail=detail, **changes))
                return _read(conn, account, machine_id)
        try:
            with engine.begin() as conn:
                conn.execute(
                    h.insert().values(
                        account=account,
                        machine_id=machine_id,
                        reason=reason,
                        detail=detail,
                        remembered_at=now,
                        expires_at=expires,
                        failures=1,
                    )
                )
                return _read(conn, account, machine_id)
        except IntegrityError:
            continue  # another writer inserted it meanwhile: update it
    raise RuntimeError(f"could not remember machine {machine_id}: its row kept changing")


def _read(conn: Any, account: str, machine_id: int) -> Memory:
    row = conn.execute(select(HOSTS).where(and_(HOSTS.c.account == account, HOSTS.c.machine_id == machine_id))).one()
    return _memory(row)


def _memory(row: Any) -> Memory:
    return Memory(
        int(row.machine_id), row.reason, row.detail, float(row.remembered_at), float(row.expires_at), int(row.failures)
    )


def avoided(engine: Any, account: str, *, now: float) -> dict[int, Memory]:
    """The machines the account avoids at ``now``, by machine id; expired memories are purged."""
    ensure_table(engine)
    h = HOSTS
    try:
        with engine.begin() as conn:
            conn.execute(delete(h).where(h.c.expires_at <= now))
    except OperationalError:
        pass  # a purge that met another writer's lock: the next read purges
    with engine.begin() as conn:
        rows = conn.execute(select(h).where(and_(h.c.account == account, h.c.expires_at > now))).all()
    return {int(row.machine_id): _memory(row) for row in rows}


def clear(engine: Any, account: str, machine_id: int | None = None) -> int:
    """Forget one machine of the account (``machine_id``), or all of them (None); the number of machines forgotten."""
    ensure_table(engine)
    h = HOSTS
    match = h.c.account == account
    if machine_id is not None:
        match = and_(match, h.c.machine_id == check_machine_id(machine_id))
    with engine.begin() as conn:
        return int(conn.execute(delete(h).where(match)).rowcount or 0)
