"""The one place a renting task's rental ends: ``end_rental``, in the task, in its failure callback and its trigger.

An end, in this order and once: the instance is destroyed (or found gone, handed over, or kept), its cost settled
on the service's clock, its record on the GPU rentals page ended, its budget reservation released at that cost, the
metric sent. The parts an end touches are given as ``Books``; each is optional, and none holds another. What the
caller held of the instance (the session's fields, the task state store's entry) it clears itself, after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import metrics
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.failures import GpuMarketDestroyFailed

if TYPE_CHECKING:
    from airflow_gpumarket.lifecycle import Rental


class Disposal(str, Enum):  # noqa: UP042 - StrEnum is 3.11+; Airflow 2.11 runs on 3.10
    """What becomes of the instance when a task is done with it."""

    DESTROY = "destroy"  # destroyed now (it was already gone: the same), then settled
    GONE = "gone"  # a read proved it gone (its job destroyed it, or somebody did): settled
    HAND_OVER = "hand_over"  # the DAG's (and its teardown's) from now on: nothing else happens here
    KEEP = (
        "keep"  # kept on purpose (outputs to copy by hand, a checkpoint's source): it bills on, settled when destroyed
    )


@dataclass
class Books:
    """What an end writes besides the destroy, each part optional.

    :param hook: the sync hook (destroy, the service's clock and charges).
    :param log: where the end is said.
    :param conn_id: the connection, whose budget ledger holds the reservation.
    :param rental: the rental as its task held it (its price and billing marks), when known: its cost is settled.
    :param record_end: writes the end of the rental's record (the GPU rentals page).
    :param release: settles the rental's budget reservation at its cost (default: ``budget.settle_ended``).
    :param destroy: destroys an instance (default: the hook's ``destroy_instance``; a trigger's async hook's, run on
        the triggerer's event loop).
    """

    hook: Any
    log: Any
    conn_id: str = ""
    rental: Rental | None = None
    record_end: Callable[[int], None] | None = None
    release: Callable[[int, float | None], None] | None = None
    destroy: Callable[[int], Any] | None = None


def end_rental(
    books: Books,
    instance_id: int,
    disposal: Disposal,
    *,
    metric: str | None,
    why: str,
    read_charge: bool = True,
    failover: bool = False,
    started: Any = None,
) -> None:
    """End ``instance_id``'s rental as ``disposal`` says, then its books; ``why`` goes into the log.

    ``metric``: the outcome ``metrics.rental_ended`` counts (None: counted already, e.g. a checkpoint's source kept
    after its preemption). ``read_charge``: settle at the service's charge when it lists one (a killed task has no
    time for the read: its estimate). A destroy that still fails after the hook's retries raises
    ``GpuMarketDestroyFailed``, naming the instance; it fails the task, and counts as ``task_failed``. ``started``:
    the instance's ``start_date`` as a listing gave it, for settling a rental these books do not hold at its charge.
    """
    if disposal is Disposal.DESTROY:
        try:
            _destroy(books, instance_id, why)
        except GpuMarketDestroyFailed:
            if metric is not None:  # a destroy that still fails fails the task: counted so, once
                metrics.rental_ended(metrics.TASK_FAILED)
            raise
    if metric is not None:
        metrics.rental_ended(metric, failover=failover)
    if disposal in (Disposal.HAND_OVER, Disposal.KEEP):
        return
    rental = books.rental if books.rental is not None and books.rental.instance_id == instance_id else None
    if rental is not None:
        from airflow_gpumarket.operators import cost

        cost.settle(books.hook, rental, books.hook.service_now(), read_charge=read_charge)
    if books.record_end is not None:
        books.record_end(instance_id)
    spent = None if rental is None else rental.cost
    if books.release is not None:
        books.release(instance_id, spent)
    else:
        from airflow_gpumarket.operators.budget import settle_ended

        settle_ended(books.hook, books.conn_id, instance_id, books.log, spent, started=started)


def _destroy(books: Books, instance_id: int, why: str) -> None:
    """Destroy with the hook's retries; if it still fails, fail loudly with the id (it is still billing)."""
    try:
        result = (books.destroy or books.hook.destroy_instance)(instance_id)
    except GpuMarketError as exc:
        metrics.destroy_failed()
        raise GpuMarketDestroyFailed(
            f"DESTROY FAILED for instance {instance_id}: it may still be billing. Destroy it by hand "
            f"(DELETE /api/v0/instances/{instance_id}/) or let the reaper DAG do it. Cause: {exc}"
        ) from exc
    gone = " (it was already gone)" if isinstance(result, dict) and result.get("already_gone") else ""
    books.log.info("Destroyed instance %s%s: %s", instance_id, gone, why)
