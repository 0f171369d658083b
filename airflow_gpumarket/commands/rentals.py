"""``airflow gpumarket rentals`` and ``orphans``: the live instances as the GPU rentals page reads them.

Both read through ``ui.sources.gather``: the instances each connection lists, their owners from the renting tasks'
records (else from their labels), and those tasks' states. An orphan is what the page calls one
(``ui.spend.orphan_reason``); ``orphans --destroy`` destroys through the hook, so a destroy is idempotent.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from airflow_gpumarket import api, credit, lifecycle
from airflow_gpumarket.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    command,
    explain,
    hook,
    table,
)
from airflow_gpumarket.exceptions import GpuMarketError

#: Days of DAG runs and records looked through for owners (the GPU rentals page's default window).
LOOKBACK_DAYS = 7
#: What ends an instance's record when ``orphans --destroy`` destroyed it.
ENDED_BY = "airflow gpumarket orphans"
#: The answers that confirm a destroy.
YES = frozenset({"y", "yes"})

log = logging.getLogger(__name__)


def connection_ids(conn_id: str | None) -> list[str]:
    """``conn_id``, else the GPU rentals page's connections; none at all is bad input."""
    if conn_id is not None:
        return [conn_id]
    from airflow.utils.session import create_session

    from airflow_gpumarket.ui import sources

    with create_session() as session:
        found = sources.connection_ids(session)
    if not found:
        raise CommandError(
            "no connection of type gpumarket is defined. Fix: add one, or name it with --conn-id.", EXIT_BAD_INPUT
        )
    return found


def gather(conn_ids: list[str]) -> tuple[Any, list[str]]:
    """What the page reads of these connections (``connection_ids``), and the ones left unread.

    A connection named with ``--conn-id``, or the only one, that is unusable or cannot be listed (a wrong key, the
    service down) fails the command before anything else is read. Among several, such a connection is left out with
    a warning, so that the others' orphans can still be seen and destroyed. Charges that cannot be read leave the
    costs estimated, with a warning.
    """
    from airflow_gpumarket.ui import sources

    readable: list[str] = []
    for each in conn_ids:
        try:
            _list(each)
        except CommandError as exc:
            if len(conn_ids) == 1:
                raise
            print(f"warning: {exc} Its instances are left out.", file=sys.stderr)
        else:
            readable.append(each)
    if not readable:
        raise CommandError("no connection could be read (see the warnings above).")
    now = time.time()
    gathered = sources.gather(now - LOOKBACK_DAYS * credit.DAY_SECONDS, now, readable)
    for error in gathered.errors:
        print(f"warning: {error}", file=sys.stderr)
    return gathered, [c for c in conn_ids if c not in readable]


def _list(conn_id: str) -> None:
    """List the connection's instances afresh (``sources.gather`` reuses the listing); a command error if it fails."""
    from airflow_gpumarket.ui import sources

    hook(conn_id)
    sources.forget_listing(conn_id)
    try:
        sources.listing(conn_id)
    except GpuMarketError as exc:
        raise CommandError(explain(exc, conn_id)) from None


def _unread_note(unread: list[str]) -> int:
    """Say which connections were not read; the exit code: failed when any was not."""
    if unread:
        print(f"Not read: {', '.join(repr(c) for c in unread)} (see the warnings); their instances are not shown.")
    return EXIT_FAILED if unread else EXIT_OK


def cost_text(row: Any) -> str:
    """The rental's cost so far, saying what it is: the service's charges, or an estimate."""
    figure = row.figure
    if figure.amount is None:
        return "unknown"
    kind = "estimate" if figure.charged is None else "charged" + (" (partly)" if figure.partial else "")
    return f"${figure.amount:.4f} {kind}"


def price_text(row: Any) -> str | None:
    """What it bills per hour now: while it does not run, its disk alone."""
    rate = row.billing_now
    if row.status in (api.STATUS_RUNNING, None):
        return None if rate is None else f"{rate:.4f}"
    return "disk only" if rate is None else f"{rate:.4f} disk"


def uptime_text(seconds: float | None) -> str:
    return "-" if seconds is None else lifecycle.format_duration(seconds)


def _owner_cells(row: Any) -> list[Any]:
    dag_id, run_id, task_id, map_index = row.owner or (None, None, None, -1)
    task = None if task_id is None else f"{task_id}{'' if map_index < 0 else f'[{map_index}]'}"
    return [dag_id, run_id, task]


@command
def rentals(args: Any) -> int:
    """Print this deployment's live rentals: instance, status, price, uptime, cost so far, DAG, run, task."""
    gathered, unread = gather(connection_ids(args.conn_id))
    mine = [r for r in gathered.live if r.owner is not None or r.orphan_reason is not None]
    several = len(gathered.conn_ids) > 1
    headers = ["INSTANCE", *(["CONN"] if several else []), "STATUS", "GPU", "$/H", "UPTIME", "COST SO FAR"]
    headers += ["DAG", "RUN", "TASK", "TASK STATE"]
    rows = []
    for row in mine:
        price = price_text(row)
        state = "ORPHAN" if row.orphan_reason else row.task_state
        cells = [row.instance_id, *([row.conn_id] if several else []), row.status, row.gpu_name, price]
        rows.append([*cells, uptime_text(row.uptime_seconds), cost_text(row), *_owner_cells(row), state])
    if rows:
        print(table(headers, rows))
    per_hour = sum(r.billing_now or 0.0 for r in mine)
    orphaned = sum(1 for r in mine if r.orphan_reason)
    print(
        f"{len(mine)} live rental{'' if len(mine) == 1 else 's'}, ${per_hour:.4f}/h together"
        + (f"; {orphaned} orphan(s): see airflow gpumarket orphans" if orphaned else "")
    )
    others = len(gathered.live) - len(mine)
    if others:
        print(f"{others} other instance(s) of the account carry no label of this provider (rented by hand): not shown.")
    return _unread_note(unread)


@command
def orphans(args: Any) -> int:
    """Print the instances no running task owns; with ``--destroy``, destroy them after a confirmation."""
    gathered, unread = gather(connection_ids(args.conn_id))
    found = [r for r in gathered.live if r.orphan_reason]
    if not found:
        print("No orphans: every instance with this provider's label belongs to a task that still runs.")
        return _unread_note(unread)
    headers = ["INSTANCE", "CONN", "STATUS", "$/H", "UPTIME", "COST SO FAR", "DAG", "RUN", "TASK", "WHY AN ORPHAN"]
    rows = [
        [r.instance_id, r.conn_id, r.status, price_text(r), uptime_text(r.uptime_seconds), cost_text(r)]
        + [*_owner_cells(r), r.orphan_reason]
        for r in found
    ]
    print(table(headers, rows))
    per_hour = sum(r.billing_now or 0.0 for r in found)
    print(f"{len(found)} orphan(s), billing ${per_hour:.4f}/h together.")
    if not args.destroy:
        print("To destroy them: airflow gpumarket orphans --destroy")
        return _unread_note(unread)
    if not args.yes and not confirmed(found, per_hour):
        print("Nothing destroyed.")
        return EXIT_FAILED
    failed = destroy({(r.conn_id, r.instance_id) for r in found})
    return _unread_note(unread) or failed


def confirmed(found: list[Any], per_hour: float) -> bool:
    """Whether the person at the terminal types yes; no answer (no terminal, end of input) is no."""
    ids = ", ".join(str(r.instance_id) for r in found)
    try:
        answer = input(f"Destroy {len(found)} instance(s) ({ids}), billing ${per_hour:.4f}/h? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in YES


def destroy(chosen: set[tuple[str, int]]) -> int:
    """Destroy the chosen instances still orphans when their connections are listed again; 1 if a destroy failed."""
    from airflow_gpumarket.operators.budget import settle_ended
    from airflow_gpumarket.ui import sources

    listed, _ = gather(sorted({conn for conn, _ in chosen}))
    fresh = {(r.conn_id, r.instance_id): r for r in listed.live if r.orphan_reason}
    failed = 0
    for conn, instance_id in sorted(chosen):
        row = fresh.get((conn, instance_id))
        if row is None:
            print(f"{instance_id}: no longer an orphan (or gone): left alone")
            continue
        destroyer = hook(conn)
        try:
            answer = destroyer.destroy_instance(instance_id)
        except GpuMarketError as exc:
            failed += 1
            print(f"error: instance {instance_id} was not destroyed: {exc}. Fix: run this again.", file=sys.stderr)
            continue
        ended = destroyer.service_now()
        sources.record_end(row, destroyer, ENDED_BY)
        settle_ended(destroyer, conn, instance_id, log, started=row.started_at, ended=ended)  # at its charge if posted
        print(f"{instance_id}: {'already gone' if answer.get('already_gone') else 'destroyed'}")
    return EXIT_FAILED if failed else EXIT_OK
