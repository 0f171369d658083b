"""Destroy what a failed task instance rented, out of its process: the failure callback of every renting operator.

In the task's process the ``RentalSession`` ends what its try holds on every failure path (an exception, SIGTERM,
``execution_timeout``). A worker lost without a trace leaves that to ``destroy_rentals_on_failure``, which Airflow
runs elsewhere; it finds the task instance's instances by their label key and ends each through
``ending.end_rental``, as the session does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import RunTimeModule

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle, metrics
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle, metrics = RunTimeModule("airflow_gpumarket.lifecycle"), RunTimeModule("airflow_gpumarket.metrics")


def destroy_rentals(
    hook: GpuMarketHook, key: str, log: Any, reason: str, end: Callable[[int], Any], *, keep: Collection[int] = ()
) -> None:
    """End (``end``) every instance whose label carries the task instance's ``key``, but those in ``keep``."""
    for instance in lifecycle.rentals_of(hook.list_instances(), key):
        if instance.get("id") in keep:
            continue
        log.warning("%s: destroying instance %s so it stops billing", reason, instance["id"])
        end(int(instance["id"]))


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

    def end(instance_id: int) -> None:
        end_rental(books, instance_id, Disposal.DESTROY, metric=metrics.TASK_FAILED, why="the task failed")

    destroy_rentals(hook, lifecycle.task_key(task, context), log, "The task failed", end)
