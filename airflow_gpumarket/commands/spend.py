"""``airflow gpumarket spend``: what the service charged today or this month, per DAG and team.

The same report as ``GpuMarketSpendReportOperator`` (``spend_report``): the account's charges, attributed to DAGs
through the budget ledger's entries, and the charges no task recorded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import Any

from airflow_gpumarket import spend_report
from airflow_gpumarket.commands.common import EXIT_BAD_INPUT, EXIT_OK, CommandError, command, hook
from airflow_gpumarket.exceptions import GpuMarketNotFoundError

#: Clocks this far apart (the simulator's runs faster) get a line saying whose day or month is reported.
CLOCKS_APART_SECONDS = 3600.0


def window_start(period: str, service_now: float) -> float:
    """The start of the service's UTC day or month that holds ``service_now``."""
    now = dt.datetime.fromtimestamp(service_now, dt.UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return (start.replace(day=1) if period == "month" else start).timestamp()


@command
def spend(args: Any) -> int:
    """Print the spend report from the start of the service's day (or month) to now."""
    from airflow_gpumarket.operators.budget import ledger_client
    from airflow_gpumarket.operators.spend_report import LEDGER_LOOKBACK

    if args.day and args.month:
        raise CommandError("give --day or --month, not both.", EXIT_BAD_INPUT)
    period = "month" if args.month else "day"
    reader = hook(args.conn_id)
    with contextlib.suppress(GpuMarketNotFoundError):  # a wrong key or a service down ends the command here
        reader.account()  # its Date header sets the service's clock, whose day (or month) is reported
    end = reader.service_now()
    start = window_start(period, end)
    try:
        charges = reader.charges(start, end)
    except GpuMarketNotFoundError:
        raise CommandError(
            "the service has no charges endpoint (a server that follows the spec only), so there is no spend to "
            "report. Fix: point the connection at the live service; the GPU rentals page shows estimates.",
        ) from None
    entries = ledger_client(reader).entries(args.conn_id, start - LEDGER_LOOKBACK.total_seconds())
    report = spend_report.build(charges, entries, start=start, end=end)
    print(report.table())
    ahead = end - time.time()
    if abs(ahead) >= CLOCKS_APART_SECONDS:  # the simulator's clock runs faster than this host's
        print(
            f"\nThe service's clock reads {dt.datetime.fromtimestamp(end, dt.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{abs(ahead) / 3600:.1f} h {'ahead of' if ahead > 0 else 'behind'} this host's: the {period} above is "
            "the service's, as its charges are dated."
        )
    print(
        "\nThese are the service's charges (actual, not estimates), as posted so far: the live rentals' latest "
        "hours may not be in them yet (airflow gpumarket rentals shows their cost so far)."
    )
    return EXIT_OK
