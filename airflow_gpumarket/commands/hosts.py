"""``airflow gpumarket hosts``: the machines the connection's account avoids (host memory), and forgetting them."""

from __future__ import annotations

from typing import Any

from airflow_gpumarket.commands.common import EXIT_BAD_INPUT, EXIT_OK, CommandError, command, hook, table
from airflow_gpumarket.spend_report import utc_time


@command
def hosts(args: Any) -> int:
    """List the avoided machines, or forget one (``--clear MACHINE_ID``) or all (``--clear-all``)."""
    from airflow_gpumarket.operators.host_memory_client import host_memory_client

    if args.clear is not None and args.clear_all:
        raise CommandError("give --clear MACHINE_ID or --clear-all, not both.", EXIT_BAD_INPUT)
    memory = host_memory_client(hook(args.conn_id), args.conn_id)
    if args.clear_all or args.clear is not None:
        cleared = memory.clear(None if args.clear_all else args.clear)
        print(f"Forgot {cleared} machine{'s' if cleared != 1 else ''}: renting tasks may choose them again.")
        return EXIT_OK
    found = sorted(memory.avoided().values(), key=lambda m: m.remembered_at)
    if not found:
        print("No machine is avoided: no rental of this account failed on a host lately.")
        return EXIT_OK
    rows = [
        (m.machine_id, m.reason, m.failures, utc_time(m.remembered_at), utc_time(m.expires_at), m.detail[:80])
        for m in found
    ]
    print(table(("MACHINE", "REASON", "FAILURES", "SINCE", "UNTIL", "DETAIL"), rows))
    return EXIT_OK
