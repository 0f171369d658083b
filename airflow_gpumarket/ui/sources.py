"""Where the GPU rentals page reads from, inside the api-server (Airflow 3.1+), and the ``airflow gpumarket`` commands.

It reads the metadata database (the renting tasks' records, task and run states, connections of type ``gpumarket``) and
the service: one paged listing per connection, through the hook and so through the same per-key budget as every other
call, cached for a few seconds so that opening and refreshing the page never starves the triggerers; and per
connection one paged read of the charges over the page's days and one of the account, cached longer (the service
posts charges by the day).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import lifecycle
from airflow_gpumarket.ui import account_charges, spend
from airflow_gpumarket.ui.records import (
    RECORD_KEY_PREFIX,
    URL_XCOM_KEY,
    end_key,
    end_only,
    record_key,
    stored_value,
    use_key,
    xcom_model,
)
from airflow_gpumarket.ui.spend import RecordRow, TaskState, TiKey

if TYPE_CHECKING:
    from airflow_gpumarket.api import Account, Charge
    from airflow_gpumarket.host_memory import Memory

#: Seconds a connection's listing is reused for.
LISTING_CACHE_SECONDS = 5.0
#: Seconds a connection's charges and account are reused for: charges come by the day, and each read of them is
#: a walk through pages on the key's budget.
MONEY_CACHE_SECONDS = 30.0
#: The page's connections when configured (``[gpumarket] ui_connections``, comma-separated); else every connection
#: of type ``gpumarket`` in the metadata database, and ``gpumarket_default`` if it resolves (an environment
#: variable or a secrets backend).
CONNECTIONS_OPTION = ("gpumarket", "ui_connections")

#: Seconds a label key that named no task instance is not looked for again.
UNKNOWN_KEY_SECONDS = 60.0

_listings: dict[str, tuple[float, list[Any], float]] = {}
_listing_lock = threading.Lock()
#: (conn_id, first day) -> (when read, its charges or the "no such endpoint" error)
_charges: dict[tuple[str, float], tuple[float, Any]] = {}
_accounts: dict[str, tuple[float, Any]] = {}  # conn_id -> (when read, its account or the "no such endpoint" error)
_owners: dict[str, TiKey] = {}  # label key -> task instance (a key never changes owner)
_unknown_keys: dict[str, float] = {}  # label key -> when it named no task instance
log = logging.getLogger(__name__)


@dataclass
class Gathered:
    """Everything the page and the commands read, before any user's access is applied."""

    conn_ids: list[str]
    #: Every instance the connections list, newest first, with its owner, task state, orphan reason and charges.
    live: list[spend.LiveRental]
    #: The rentals of the window's records (``spend.spans``).
    spans: list[spend.Span]
    #: Each connection's charges over the window's and the runway's days (``account_charges.charges_window``).
    charges_of: dict[str, list[Any]]
    #: The service's clock minus this host's, per connection that answered.
    clock_offsets: dict[str, float]
    #: Connections whose service has no charges endpoint: their rentals are estimated.
    no_charges: list[str] = field(default_factory=list)
    #: One sentence per connection that could not be listed or whose charges could not be read.
    errors: list[str] = field(default_factory=list)

    @property
    def charges(self) -> list[Any]:
        return account_charges.merged_charges(self.charges_of.values())


def gather(since: float, now: float, conn_ids: list[str] | None = None) -> Gathered:
    """The live instances, their owners and the window's rentals and charges, of ``conn_ids`` (default: the page's).

    ``since`` and ``now`` are this host's epoch seconds. A connection that cannot be listed, or whose charges cannot be
    read, is named in ``errors``; no database session is held while the service answers.
    """
    from airflow.utils.session import create_session

    from airflow_gpumarket.exceptions import GpuMarketError

    if conn_ids is None:
        with create_session() as session:
            conn_ids = connection_ids(session)
    errors: list[str] = []
    listed: list[tuple[str, dict[str, Any]]] = []
    clock_offsets: dict[str, float] = {}
    for conn_id in conn_ids:
        try:
            instances, clock_offsets[conn_id] = listing(conn_id)
        except GpuMarketError as exc:
            errors.append(f"Could not list the instances of connection {conn_id!r}: {exc}")
            continue
        listed += [(conn_id, i) for i in instances]
    charges_of, no_charges = _window_charges(conn_ids, since, now, clock_offsets, errors)
    alive = {i["id"] for _, i in listed if isinstance(i.get("id"), int)}
    with create_session() as session:
        # From the window's first midnight: the charges of that day are counted, and so are their rentals' owners.
        rows = records(session, since=account_charges.day_start(since), instance_ids=alive)
        starts = [r for r in rows if not r.end_only]
        by_instance = spend.records_of(listed, starts)
        keys = {spend.label_key(i.get("label")) for _, i in listed if i.get("id") not in by_instance}
        keys |= {r.rental_key for r in rows if r.end_only}
        attributed = label_owners(session, {k for k in keys if k}, since=since)
        tasks = task_states(session, [r.ti_key for r in starts] + list(attributed.values()))
        used = users(session, alive)
    live = spend.live_rentals(listed, by_instance, tasks, now, clock_offsets, attributed)
    for row in live:
        row.used_by = tuple(sorted(used.get(row.instance_id, ())))
    gathered = Gathered(conn_ids, live, spend.spans(rows, attributed), charges_of, clock_offsets, no_charges, errors)
    spend.charge_live(live, gathered.charges, since)
    return gathered


def _window_charges(
    conn_ids: list[str], since: float, now: float, clock_offsets: dict[str, float], errors: list[str]
) -> tuple[dict[str, list[Any]], list[str]]:
    """Each connection's charges over the window's and the runway's days, and the connections without charges.

    A service with no charges endpoint is noted, not an error: its rentals are estimated.
    """
    from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketNotFoundError

    charges_of: dict[str, list[Any]] = {}
    no_charges = []
    for conn_id in conn_ids:
        start, end = account_charges.charges_window(since, now + clock_offsets.get(conn_id, 0.0))
        try:
            charges_of[conn_id] = charges(conn_id, start, end)
        except GpuMarketNotFoundError:
            no_charges.append(conn_id)
        except GpuMarketError as exc:
            errors.append(f"Could not read the charges of connection {conn_id!r}, so its figures are estimates: {exc}")
    return charges_of, no_charges


def budgets_in_force(now: float) -> list[tuple[str, Any, list[Any]]]:
    """Each budgeted DAG, its budgets (``budgets.Limits``) and their headroom in the current windows (``Headroom``).

    Read from the ``gpumarket_budgets`` Variable and the budget ledger in this database, as a reservation is checked;
    raises ``budgets.BudgetConfigError`` naming a malformed Variable.
    """
    from airflow import settings

    from airflow_gpumarket import budgets, ledger

    since = budgets.earliest_window_start(now)
    entries = [ledger.entry_of(r) for r in ledger.entries(settings.engine, since=since)]
    limits = budgets.limits_by_dag(ledger.budgets_variable(), {e.dag_id for e in entries})
    return [
        (dag_id, limit, budgets.headroom(limit, entries, dag_id=dag_id, now=now))
        for dag_id, limit in limits.items()
        if limit is not None
    ]


def connection_ids(session: Any) -> list[str]:
    from airflow.configuration import conf
    from airflow.models.connection import Connection
    from sqlalchemy import select

    configured = conf.get(*CONNECTIONS_OPTION, fallback="") or ""
    if configured.strip():
        return [c.strip() for c in configured.split(",") if c.strip()]
    ids = set(session.scalars(select(Connection.conn_id).where(Connection.conn_type == "gpumarket")))
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    default = GpuMarketHook.default_conn_name
    if default not in ids:
        try:
            Connection.get_connection_from_secrets(default)
            ids.add(default)
        except Exception:  # noqa: BLE001 - no default connection: nothing to add
            pass
    return sorted(ids)


def listing(conn_id: str) -> tuple[list[Any], float]:
    """The connection's instances, at most ``LISTING_CACHE_SECONDS`` old, and the service's clock offset.

    The offset is the service's clock minus this host's when it listed them (``GpuMarketHook.service_clock_offset``).
    """
    now = time.monotonic()
    with _listing_lock:
        cached = _listings.get(conn_id)
        if cached and now - cached[0] < LISTING_CACHE_SECONDS:
            return cached[1], cached[2]
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook = GpuMarketHook(conn_id)
    instances = hook.list_instances()
    with _listing_lock:
        _listings[conn_id] = (time.monotonic(), instances, hook.service_clock_offset)
    return instances, hook.service_clock_offset


def forget_listing(conn_id: str) -> None:
    with _listing_lock:
        _listings.pop(conn_id, None)


def charges(conn_id: str, start: float, end: float) -> list[Charge]:
    """The connection's charges of the days from ``start`` to ``end``, at most ``MONEY_CACHE_SECONDS`` old.

    A read that began at the same ``start`` is reused, whatever its end: the page asks from a midnight to now.

    :raises GpuMarketNotFoundError: the service has no charges endpoint (remembered as long as charges are).
    """
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    return _cached(_charges, (conn_id, start), lambda: GpuMarketHook(conn_id).charges(start, end))


def account(conn_id: str) -> Account:
    """The connection's account (its credit), at most ``MONEY_CACHE_SECONDS`` old.

    :raises GpuMarketNotFoundError: the service has no account endpoint (remembered as long as the account is).
    """
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    return _cached(_accounts, conn_id, lambda: GpuMarketHook(conn_id).account())


def _cached(cache: dict[Any, tuple[float, Any]], key: Any, read: Callable[[], Any]) -> Any:
    """``read()``'s answer, or its "no such endpoint" error, reused for ``MONEY_CACHE_SECONDS``; other errors not."""
    from airflow_gpumarket.exceptions import GpuMarketNotFoundError

    now = time.monotonic()
    with _listing_lock:
        cached = cache.get(key)
        if cached is None or now - cached[0] >= MONEY_CACHE_SECONDS:
            cached = None
            for old in [k for k, (t, _) in cache.items() if now - t >= MONEY_CACHE_SECONDS]:
                del cache[old]
    if cached is None:
        try:
            answer: Any = read()
        except GpuMarketNotFoundError as missing:
            answer = missing
        cached = (time.monotonic(), answer)
        with _listing_lock:
            cache[key] = cached
    if isinstance(cached[1], Exception):
        raise cached[1].with_traceback(None)  # the same error again, without the earlier raises' frames
    return cached[1]


def records(session: Any, *, since: float, instance_ids: Iterable[int]) -> list[RecordRow]:
    """Rental records written since ``since`` (epoch seconds), plus those of the given (live) instances.

    The live instances' records count whenever they were written.
    """
    import datetime as dt

    from sqlalchemy import or_, select

    XComModel = xcom_model()
    wanted = [record_key(i) for i in instance_ids]
    since_dt = dt.datetime.fromtimestamp(since, dt.UTC)
    query = select(XComModel).where(
        XComModel.key.like(f"{RECORD_KEY_PREFIX}%"),
        XComModel.key != URL_XCOM_KEY,
        or_(XComModel.timestamp >= since_dt, XComModel.key.in_(wanted)),
    )
    rows = []
    for xcom in session.scalars(query):
        value = stored_value(XComModel, xcom)
        if isinstance(value, dict) and isinstance(value.get("instance_id"), int):
            rows.append(RecordRow(xcom.dag_id, xcom.run_id, xcom.task_id, xcom.map_index, value))
    return rows


def users(session: Any, instance_ids: Iterable[int]) -> dict[int, list[TiKey]]:
    """The task instances that reached each of these rented services (``connect_service``'s records)."""
    from sqlalchemy import select

    XComModel = xcom_model()
    by_key = {use_key(i): i for i in instance_ids}
    found: dict[int, list[TiKey]] = {}
    if not by_key:
        return found
    query = select(XComModel.key, XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index)
    for key, dag_id, run_id, task_id, map_index in session.execute(query.where(XComModel.key.in_(list(by_key)))):
        found.setdefault(by_key[key], []).append((dag_id, run_id, task_id, map_index))
    return found


def avoided_machines(conn_ids: list[str], now: float, errors: list[str]) -> list[tuple[tuple[str, ...], Memory]]:
    """The machines the connections' accounts avoid at ``now`` (host memory), latest first, each with the connections
    of its account (two when they share a key). A connection whose memory cannot be read is named in ``errors``."""
    from airflow_gpumarket import host_memory
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    accounts: dict[str, list[str]] = {}
    for conn_id in conn_ids:
        try:
            accounts.setdefault(host_memory.account_of(GpuMarketHook(conn_id).settings.api_key), []).append(conn_id)
        except Exception as exc:  # noqa: BLE001 - a connection the api-server cannot read, for any reason
            errors.append(f"Could not read the host memory of connection {conn_id!r}: {exc}")
    rows = []
    for account, names in accounts.items():
        try:
            found = host_memory.avoided(_engine(), account, now=now)
        except Exception as exc:  # noqa: BLE001 - the rest of the page does not depend on it
            errors.append(f"Could not read the host memory of connection {', '.join(map(repr, names))}: {exc}")
            continue
        rows += [(tuple(names), memory) for memory in found.values()]
    return sorted(rows, key=lambda row: -row[1].remembered_at)


def _engine() -> Any:
    from airflow import settings

    return settings.engine


def all_dag_ids(session: Any) -> set[str]:
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    return set(session.scalars(select(DagModel.dag_id)))


def label_owners(session: Any, keys: Iterable[str], *, since: float) -> dict[str, TiKey]:
    """The task instance each label key derives from (``lifecycle.rental_key``).

    Looked for among the task instances of DAG runs since ``since`` (epoch seconds). A key is a one-way digest, so the
    candidates are hashed.
    """
    import datetime as dt

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    now = time.monotonic()
    wanted = set(keys)
    missing = {
        k for k in wanted - _owners.keys() if now - _unknown_keys.get(k, -UNKNOWN_KEY_SECONDS) >= UNKNOWN_KEY_SECONDS
    }
    if missing:
        query = (
            select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index)
            .join(DagRun, (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id))
            .where(_run_after(DagRun) >= dt.datetime.fromtimestamp(since, dt.UTC))
        )
        for dag_id, run_id, task_id, map_index in session.execute(query):
            key = lifecycle.rental_key(dag_id, run_id, task_id, map_index)
            if key in missing:
                _owners[key] = (dag_id, run_id, task_id, map_index)
        _unknown_keys.update({k: now for k in missing - _owners.keys()})
    return {k: _owners[k] for k in wanted if k in _owners}


def _run_after(dag_run: Any) -> Any:
    """The column a DAG run is dated by: ``run_after`` on Airflow 3, the logical date on 2.11."""
    return dag_run.run_after if hasattr(dag_run, "run_after") else dag_run.execution_date


def write_end(session: Any, owner: TiKey, record: dict[str, Any]) -> None:
    """Store an end record on the owner's task instance (the page's Destroy: the api-server has the database)."""
    dag_id, run_id, task_id, map_index = owner
    xcom_model().set(
        end_key(record["instance_id"]),
        record,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        session=session,
    )


def task_states(session: Any, tis: Iterable[TiKey]) -> dict[TiKey, TaskState]:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select, tuple_

    keys = set(tis)
    if not keys:
        return {}
    query = (
        select(
            TaskInstance.dag_id,
            TaskInstance.run_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.state,
            TaskInstance.end_date,
            DagRun.state,
        )
        .join(DagRun, (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id))
        .where(tuple_(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index).in_(keys))
    )
    states = {}
    for dag_id, run_id, task_id, map_index, state, end_date, run_state in session.execute(query):
        states[(dag_id, run_id, task_id, map_index)] = TaskState(
            state=None if state is None else str(getattr(state, "value", state)),
            end_date=end_date.timestamp() if end_date else None,
            run_state=None if run_state is None else str(getattr(run_state, "value", run_state)),
        )
    return states


def record_end(row: spend.LiveRental, hook: Any, ended_by: str) -> None:
    """A destroyed rental's end, on its owner's XComs, so its cost stays in its DAG's spend. Never raises."""
    if row.owner is None:
        return
    from airflow.utils.session import create_session

    seen = {"label": row.label, "start_date": row.started_at, "dph_total": row.hourly_price, "gpu_name": row.gpu_name}
    end = end_only(
        instance_id=row.instance_id,
        ended_at=hook.service_now(),
        ended_by=ended_by,
        instance={**seen, "offer_id": row.offer_id},
    )
    try:
        with create_session() as session:
            write_end(session, row.owner, end)
    except Exception as exc:  # noqa: BLE001 - destroyed all the same; only its spend loses its end
        log.warning("Could not record the end of instance %s: %s", row.instance_id, exc)
