"""What the commands share: a connection's hook, one line per error with its exit code, plain tables."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from airflow_gpumarket.exceptions import (
    GpuMarketError,
    GpuMarketTransportError,
    GpuMarketValidationError,
)
from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

#: Exit codes: done; the service or a needed check failed; the command was given something unusable.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
#: Only the last characters of an API key are ever shown, and only of a key long enough to keep the rest secret.
KEY_SHOWN_CHARS = 4
KEY_SHOWN_MIN_LENGTH = 16
#: The fixes of the two failures an operator meets first.
FIX_KEY = "put a valid key from the web console's API keys page in the connection's password."
FIX_REACH = "check the connection's host and this machine's network (for the simulator: is gpumarket-sim running?)."
#: Airflow 3 reads connections from its metadata database only in a process that says it is a server, as its own
#: ``airflow connections get`` does; a command may read that database, so it says so.
PROCESS_CONTEXT = "_AIRFLOW_PROCESS_CONTEXT"


class CommandError(Exception):
    """A command's failure: its one-line message and exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def command(func: Callable[[Any], int | None]) -> Callable[[Any], None]:
    """A command's entry: its failures become one line on stderr and a non-zero exit, never a traceback."""

    @functools.wraps(func)
    def entry(args: Any) -> None:
        previous = os.environ.get(PROCESS_CONTEXT)
        os.environ[PROCESS_CONTEXT] = "server"
        try:
            code = func(args)
        except CommandError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(exc.code) from None
        except GpuMarketError as exc:
            print(f"error: {explain(exc, getattr(args, 'conn_id', None))}", file=sys.stderr)
            raise SystemExit(EXIT_FAILED) from None
        finally:
            if previous is None:
                os.environ.pop(PROCESS_CONTEXT, None)
            else:
                os.environ[PROCESS_CONTEXT] = previous
        if code:
            raise SystemExit(code)

    return entry


def explain(exc: GpuMarketError, conn_id: str | None) -> str:
    """The error in a sentence, with the fix when the hook's message has none (a refused key's names it)."""
    where = f"connection {conn_id!r}: " if conn_id else ""
    if isinstance(exc, GpuMarketTransportError):
        return f"{where}the service could not be reached ({exc}). Fix: {FIX_REACH}"
    return f"{where}{exc}"


def hook(conn_id: str) -> GpuMarketHook:
    """The connection's hook, its settings read: an unknown or unusable connection is bad input."""
    from airflow_gpumarket._compat import AirflowNotFoundException

    made = GpuMarketHook(conn_id)
    try:
        made.settings  # noqa: B018 - reads the connection now, so its problems are told before any request
    except AirflowNotFoundException:
        raise CommandError(
            f"connection {conn_id!r} is not defined. Fix: add it (airflow connections add {conn_id} --conn-type "
            "gpumarket --conn-host URL --conn-password KEY) or name another with --conn-id.",
            EXIT_BAD_INPUT,
        ) from None
    except GpuMarketValidationError as exc:
        raise CommandError(str(exc), EXIT_BAD_INPUT) from None
    return made


def key_hint(key: str) -> str:
    """An API key as it may be shown: its last few characters, or nothing of a short one."""
    return f"…{key[-KEY_SHOWN_CHARS:]}" if len(key) >= KEY_SHOWN_MIN_LENGTH else "(too short to show any of it)"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as left-aligned columns under their headers; None shows as ``-``."""
    texts = [[("-" if cell is None else str(cell)) for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
    lines = [headers, *texts]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)
