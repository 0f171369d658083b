"""What several operators and sensors share: run-time values, durations, instance ids, the deferrable default.

No Airflow import at module level but the configuration read once for ``DEFAULT_DEFERRABLE``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError


class RunTimeModule:
    """A module imported when first used.

    For what only a running task needs, which a DAG file importing an operator does not pay for (``if TYPE_CHECKING:``
    imports the module itself, for type checkers).
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


_INFINITY = float("inf")
#: Values that are never resolved at run time (checked first: this runs for every field of every task parsed).
_PLAIN = (str, int, float, type(None), timedelta)


def resolved_at_run_time(value: Any) -> bool:
    """Whether ``value`` holds something Airflow resolves when the task runs, so it is checked then.

    That is an upstream task's output (``XComArg``, ``.output``), a DAG param or a mapped argument, at any depth of a
    mapping or list.
    """
    if isinstance(value, _PLAIN):
        return False
    if callable(getattr(value, "resolve", None)) and hasattr(value, "iter_references"):
        return True
    if isinstance(value, Mapping):
        return any(resolved_at_run_time(k) or resolved_at_run_time(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(resolved_at_run_time(v) for v in value)
    return False


def is_templated(value: Any) -> bool:
    """Only known when the task runs: Jinja text or something Airflow resolves (see ``resolved_at_run_time``)."""
    kind = type(value)  # plain containers first, by type: this walks every argument of every task parsed
    if kind is dict:
        return any(resolved_at_run_time(k) or is_templated(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return any(is_templated(v) for v in value)
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, _PLAIN):
        return False
    if resolved_at_run_time(value):
        return True
    if isinstance(value, Mapping):
        return any(is_templated(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_templated(v) for v in value)
    return False


def duration_seconds(name: str, value: timedelta | float, *, zero_ok: bool = False) -> float:
    """A positive duration (or 0 with ``zero_ok``) given as timedelta or seconds; refused at parse time otherwise."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (type(seconds) is float or type(seconds) is int) and (0 < seconds < _INFINITY or (zero_ok and seconds == 0)):
        return float(seconds)  # the common case, without the checks' messages
    try:
        (api.require_non_negative_number if zero_ok else api.require_positive_number)(name, seconds)
    except GpuMarketValidationError:
        least = "of at least 0" if zero_ok else "greater than 0"
        raise GpuMarketValidationError(
            name, f"must be a datetime.timedelta or seconds {least}, got {value!r}; e.g. timedelta(hours=2)"
        ) from None
    return float(seconds)


def try_number(context: Any) -> int:
    """The try of the task instance in ``context`` (1 when it does not tell)."""
    ti = context.get("ti") if isinstance(context, Mapping) else None
    return getattr(ti, "try_number", 1) or 1


def try_started(context: Any, fallback: float) -> float:
    """When this try started: its task instance's ``start_date`` (the same across deferrals), else ``fallback``."""
    ti = context.get("ti") if isinstance(context, Mapping) else None
    start_date = getattr(ti, "start_date", None)
    return start_date.timestamp() if isinstance(start_date, datetime) else fallback


#: A prefix of the database URL that Airflow 3 gives task processes instead of the real one.
_BLOCKED_DB = "airflow-db-not-allowed"


def metadata_engine() -> Any:
    """The metadata database's engine when task code may use it in this process, else None."""
    try:
        from airflow import settings

        engine = getattr(settings, "engine", None)
    except Exception:  # noqa: BLE001 - any failure means: not from this process
        return None
    if engine is None or str(getattr(engine, "url", "")).startswith(_BLOCKED_DB):
        return None
    return engine


def read_default_deferrable() -> bool:
    from airflow.configuration import conf

    return conf.getboolean("operators", "default_deferrable", fallback=False)


#: ``[operators] default_deferrable``, read once per process like the official providers do.
DEFAULT_DEFERRABLE = read_default_deferrable()


def instance_id_from(value: Any) -> int | None:
    """Accept an id, a numeric string, or the dict a renting operator returns; None/"None"/"" mean nothing."""
    if isinstance(value, Mapping):
        value = value.get("instance_id")
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    try:
        instance_id = int(value)
    except (TypeError, ValueError):
        raise GpuMarketValidationError("instance_id", f"must be an instance id (integer), got {value!r}") from None
    api.require_positive_int("instance_id", instance_id)
    return instance_id


def check_instance_id_argument(value: Any) -> None:
    """Refuse a bad instance id when the DAG is parsed.

    A template or an upstream task's output (XComArg) is checked when it is resolved.
    """
    if not is_templated(value):
        instance_id_from(value)
