"""``airflow gpumarket budgets``: each DAG's budgets with what is spent, reserved and left in the current windows.

The budgets are the ``gpumarket_budgets`` Variable's; the amounts are the budget ledger's (a settled rental counts
its cost, an open one its reserved worst case), the same figures a renting task's reservation is checked against.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_gpumarket import budgets, ledger
from airflow_gpumarket.commands.common import EXIT_OK, CommandError, command, hook, table


def entries(conn_ids: list[str]) -> list[budgets.Entry]:
    """The ledger's reservations since the earliest window (this month or this week) began, of every connection."""
    from airflow_gpumarket.operators.budget import ledger_client

    since = budgets.earliest_window_start(time.time())
    found: dict[Any, budgets.Entry] = {}
    for conn_id in conn_ids:
        for record in ledger_client(hook(conn_id)).entries(conn_id, since):
            found[record.get("id", id(record))] = ledger.entry_of(record)
    return list(found.values())


def dag_limits(dag_ids: set[str]) -> dict[str, budgets.Limits | None]:
    """Each DAG's budgets from the Variable (its own entry, else ``"*"``); a DAG named there is always listed."""
    try:
        return budgets.limits_by_dag(ledger.budgets_variable(), dag_ids)
    except budgets.BudgetConfigError as exc:
        raise CommandError(str(exc)) from None


def rows(limits: dict[str, budgets.Limits | None], found: list[budgets.Entry], now: float) -> list[tuple]:
    """One row per DAG and budget: the window, the limit, spent, reserved, left."""
    made: list[tuple] = []
    for dag_id, limit in limits.items():
        if limit is None:
            spent = sum(e.amount for e in found if e.dag_id == dag_id and not e.open)
            reserved = sum(e.amount for e in found if e.dag_id == dag_id and e.open)
            made.append((dag_id, "-", "no budget", _dollars(spent), _dollars(reserved), "-"))
            continue
        if limit.run is not None:
            made.append((dag_id, "run", _dollars(limit.run), "-", "-", "per run"))
        for room in budgets.headroom(limit, found, dag_id=dag_id, now=now):
            made.append(
                (
                    dag_id,
                    room.period,
                    _dollars(room.limit),
                    _dollars(room.spent),
                    _dollars(room.reserved),
                    _dollars(room.left),
                )
            )
    return made


def unknown_dags(named: set[str]) -> list[str]:
    """The DAG ids of ``named`` that no DAG Airflow knows has (none when Airflow's DAGs cannot be read)."""
    from airflow.utils.session import create_session

    from airflow_gpumarket.ui import sources

    try:
        with create_session() as session:
            known = sources.all_dag_ids(session)
    except Exception:  # noqa: BLE001 - a database that cannot say: nothing is flagged
        return []
    return sorted(named - known) if known else []


def _dollars(amount: float) -> str:
    return f"-${-amount:.4f}" if amount < 0 else f"${amount:.4f}"


@command
def budgets_command(args: Any) -> int:
    """Print every budgeted DAG (and every DAG that rented this month) with its headroom."""
    from airflow_gpumarket.commands.rentals import connection_ids

    conn_ids = connection_ids(args.conn_id)
    found = entries(conn_ids)
    limits = dag_limits({e.dag_id for e in found})
    if not limits:
        print(f"No DAG has a budget ({budgets.VARIABLE} is not set) and none rented this month.")
        return EXIT_OK
    print(table(("DAG", "WINDOW", "BUDGET", "SPENT", "RESERVED", "LEFT"), rows(limits, found, time.time())))
    print(
        "\nWindows are UTC (day, ISO week, month). SPENT: settled rentals, at the service's charge when one was "
        "posted; RESERVED: the worst case of rentals still open. A rental is refused when its worst case exceeds LEFT."
    )
    named = {dag_id for dag_id, limit in limits.items() if limit is not None} - {e.dag_id for e in found}
    for dag_id in unknown_dags(named):
        print(
            f"note: {budgets.VARIABLE} budgets DAG {dag_id!r}, which no DAG Airflow knows has: if it is a typo, "
            "the DAG it meant rents without that budget."
        )
    return EXIT_OK
