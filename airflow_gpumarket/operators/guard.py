"""Destroy what a failed task instance rented, out of its process: the failure callback of every renting operator.

In the task's process the ``RentalSession`` ends what its try holds on every failure path (an exception, SIGTERM,
``execution_timeout``). A worker lost without a trace leaves that to ``destroy_rentals_on_failure``, which Airflow
runs elsewhere; it finds the task instance's instances by their label key and ends each through
``ending.end_rental``, as the session does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import RunTimeModule

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle, metrics
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle, metrics = RunTimeModule("airflow_gpumarket.lifecycle"), RunTimeModule("airflow_gpumarket.metrics")


def destroy_rentals(
    listed: Iterable[Mapping[str, Any]],
    key: str,
    log: Any,
    reason: str,
    end: Callable[[Mapping[str, Any]], Any],
    *,
    keep: Collection[int] = (),
) -> None:
    """End (``end``, given its record) every instance ``listed`` whose label carries the task instance's ``key``,
    but not ``keep``."""
    for instance in lifecycle.rentals_of(listed, key):
        if instance.get("id") in keep:
            continue
        log.warning("%s: destroying instance %s so it stops billing", reason, instance["id"])
        end(instance)


def destroy_rentals_on_failure(context: Any) -> None:
    """Failure callback that every renting operator adds to its ``on_failure_callback`` list.

    Airflow runs failure callbacks in the worker after a failed try, and in the DAG processor when the scheduler
    fails a task whose worker stopped heartbeating. Either way, this destroys every instance carrying the task
    instance's label key. Mapped tasks (``partial()`` skips the operator's ``__init__``) pass it themselves:
    ``.partial(..., on_failure_callback=destroy_rentals_on_failure)``; ``@task.gpumarket`` does it itself.
    """
    task: Any = context.get("task") if isinstance(context, Mapping) else None
    operator_class: Any = getattr(task, "operator_class", type(task))  # a mapped task names its class
    if not (isinstance(operator_class, type) and getattr(operator_class, "rents_instances", False)):
        return
    session = getattr(task, "session", None)  # set in the worker that ran the try; None elsewhere
    if session is not None and session.rented_nothing:
        task.log.info("The task failed before renting anything: no instance to look for")
        return
    from airflow_gpumarket.exceptions import GpuMarketError
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    hook: GpuMarketHook
    if isinstance(task, GpuMarketBaseOperator):
        hook = task.hook
    else:  # a mapped task is never unmapped here: its connection comes from the partial() arguments
        partial_kwargs = getattr(task, "partial_kwargs", None) or {}
        hook = GpuMarketHook(partial_kwargs.get("gpumarket_conn_id", GpuMarketHook.default_conn_name))
    from airflow_gpumarket.operators.ending import Books, Disposal, end_rental

    log = getattr(task, "log", None) or hook.log
    books = Books(hook, log, conn_id=getattr(hook, "gpumarket_conn_id", ""))

    def end(instance: Mapping[str, Any]) -> None:
        instance_id, started = int(instance["id"]), instance.get("start_date")
        end_rental(
            books, instance_id, Disposal.DESTROY, metric=metrics.TASK_FAILED, why="the task failed", started=started
        )

    try:
        listed = hook.list_instances()
    except GpuMarketError as exc:  # said once, without a second traceback: the task's own failure has one
        log.error(
            "Could not look for the instances this task rented (%s). Anything left is destroyed by "
            "GpuMarketReapOrphansOperator when its lease ends, or now by `airflow gpumarket orphans --destroy`.",
            exc,
        )
        return
    destroy_rentals(listed, lifecycle.task_key(task, context), log, "The task failed", end)
