"""The provider's metrics, sent through Airflow's ``Stats`` (StatsD, DogStatsD or OpenTelemetry, as ``[metrics]`` says).

Every name starts with ``gpumarket.`` (after Airflow's own ``[metrics] statsd_prefix``); the one dimension a dashboard
splits on (an outcome, a reason, an API operation) is the name's last part, so plain StatsD shows it, and a tag as
well; ``dag_id`` and ``task_id`` are tags when a task sends the metric. The names and tags are listed in
``docs/reference/metrics.md``. A metric never raises: whatever fails is logged at debug level and the task goes on.
Nothing here imports Airflow's metrics client before a metric is sent.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow_gpumarket import api

log = logging.getLogger(__name__)

PREFIX = "gpumarket"
#: How a rental ended (``gpumarket.rental.ended.<outcome>``).
SUCCEEDED = "succeeded"
JOB_FAILED = "job_failed"
MAX_COST = "max_cost"
TIMED_OUT = "timed_out"
LOST = "lost"
NEVER_RAN = "never_ran"
PREEMPTED = "preempted"
HANDED_OVER = "handed_over"
TASK_FAILED = "task_failed"
OUTCOMES = (SUCCEEDED, JOB_FAILED, MAX_COST, TIMED_OUT, LOST, NEVER_RAN, PREEMPTED, HANDED_OVER, TASK_FAILED)
#: HTTP status of a rate-limited answer.
TOO_MANY_REQUESTS = 429


def _stats() -> Any:
    """Airflow's ``Stats`` as this process configured it.

    On Airflow 3 the task SDK and the scheduler's side each keep a copy of the metrics module; a triggerer sets up only
    the latter, so that one is used when the SDK's copy was never set up.
    """
    from airflow_gpumarket._compat import Stats

    module = sys.modules.get(getattr(Stats.incr, "__module__", ""))
    if module is not None and getattr(module, "_factory", True) is None:
        try:
            core = importlib.import_module("airflow.observability.stats").Stats
        except ImportError:
            return Stats
        core_module = sys.modules.get(getattr(core.incr, "__module__", ""))
        if core_module is not None and getattr(core_module, "_factory", None) is not None:
            return core
    return Stats


def _task_tags() -> dict[str, str]:
    """``dag_id`` and ``task_id`` of the task running in this process, if any."""
    try:
        from airflow_gpumarket._compat import get_current_context

        ti = get_current_context().get("ti")
    except Exception:  # noqa: BLE001 - no task here (a triggerer, a callback): no such tags
        return {}
    names = {"dag_id": getattr(ti, "dag_id", None), "task_id": getattr(ti, "task_id", None)}
    return {k: str(v) for k, v in names.items() if v}


def _send(kind: str, name: str, value: Any = None, tags: Mapping[str, Any] | None = None) -> None:
    """One metric (``incr``: a count, ``timing``: a duration); any failure is logged, never raised."""
    try:
        stats = _stats()
        all_tags = {**_task_tags(), **{k: str(v) for k, v in (tags or {}).items()}}
        if kind == "timing":
            stats.timing(f"{PREFIX}.{name}", value, tags=all_tags)
        else:
            stats.incr(f"{PREFIX}.{name}", 1 if value is None else value, tags=all_tags)
    except Exception as exc:  # noqa: BLE001 - a metric never fails a task
        log.debug("Could not send metric %s.%s: %s", PREFIX, name, exc)


def rental_started(*, interruptible: bool) -> None:
    """An instance was created for a task."""
    _send("incr", "rental.started", tags={"interruptible": str(interruptible).lower()})


def rental_ended(outcome: str, *, failover: bool = False) -> None:
    """A task is done with a rental (``OUTCOMES``); ``failover``: it rents another one for the same job."""
    _send("incr", f"rental.ended.{outcome}", tags={"outcome": outcome})
    if failover:
        _send("incr", f"rental.failover.{outcome}", tags={"reason": outcome})


def outcome(ended: Any) -> str:
    """How a watched job's rental ended, from the ``outcome.WaitOutcome`` its wait ended with."""
    from airflow_gpumarket.outcome import MAX_COST as COST_LIMIT
    from airflow_gpumarket.outcome import EventKind

    if ended.kind is EventKind.JOB_SUCCEEDED:
        return SUCCEEDED
    if ended.limit == COST_LIMIT:
        return MAX_COST
    if ended.kind is EventKind.TIMEOUT:
        return TIMED_OUT
    return JOB_FAILED if ended.kind is EventKind.JOB_FAILED else LOST


def booted(rental: Any) -> None:
    """A rental was first seen running: seconds from its creation."""
    running_at, created_at = getattr(rental, "running_at", None), getattr(rental, "created_at", None)
    if api.is_positive_number(running_at) and api.is_positive_number(created_at):
        _send("timing", "rental.boot", timedelta(seconds=max(0.0, running_at - created_at)))


def preempted() -> None:
    """A bid instance of a task was preempted."""
    _send("incr", "rental.preempted")


def destroy_failed() -> None:
    """A destroy still failed after the hook's retries: the instance may still bill."""
    _send("incr", "instance.destroy_failed")


def answered(operation: str, status_code: int) -> None:
    """An API answer; a 429 counts as ``gpumarket.api.rate_limited.<operation>``."""
    if status_code == TOO_MANY_REQUESTS:
        _send("incr", f"api.rate_limited.{operation}", tags={"operation": operation})


def budget_reserved(dollars: float) -> None:
    """A rental's worst case was reserved in the budget ledger (a count of dollars)."""
    if api.is_positive_number(dollars):
        _send("incr", "budget.reserved_dollars", float(dollars))


def budget_settled(dollars: Any) -> None:
    """An ended rental's reservation became what it cost (a count of dollars)."""
    if isinstance(dollars, int | float) and not isinstance(dollars, bool) and dollars >= 0:
        _send("incr", "budget.settled_dollars", float(dollars))
