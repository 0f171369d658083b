"""What a try of a renting task hands its operator (``RentalResult``) and what the task returns of it (``summary``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from airflow_gpumarket import lifecycle
from airflow_gpumarket.operators import cost
from airflow_gpumarket.outcome import EventKind, WaitOutcome


class RentalResult(NamedTuple):
    """How a rental's wait ended, for the operator to judge: the rental and the outcome (None: not waited for)."""

    rental: lifecycle.Rental
    outcome: WaitOutcome | None
    context: Any = None  # the task's context (its outlets' asset events)

    @property
    def kind(self) -> EventKind | None:
        return None if self.outcome is None else self.outcome.kind

    @property
    def status(self) -> str | None:
        """The instance's status as the wait last read it."""
        return None if self.outcome is None else self.outcome.actual_status


def summary(rental: lifecycle.Rental, status: str | None, service_now: Callable[[], float]) -> dict[str, Any]:
    """What a renting task returns of its rental; times and costs on the service's clock, up to its end if it ended.

    ``cost`` covers every rental of the task instance (a failover's, a preempted checkpoint source's), each in
    ``rentals``; ``estimated_cost`` is this rental's alone.
    """
    end = rental.ended_at if rental.ended_at is not None else service_now()
    estimate = rental.cost_until(end, digits=6)
    mine = {
        "instance_id": rental.instance_id,
        "cost": estimate if rental.cost is None else rental.cost,
        "cost_kind": rental.cost_kind or cost.ESTIMATED,
    }
    rentals = [e for e in rental.attempts.ended if e["instance_id"] != rental.instance_id] + [mine]
    spent, kind = cost.total(rentals)
    return {
        "instance_id": rental.instance_id,
        "offer_id": rental.offer_id,
        "dph_total": rental.dph_total,
        **({} if rental.bid is None else {"bid": rental.bid, "preemptions": rental.attempts.preemptions}),
        "gpu_name": rental.gpu_name,
        "label": rental.label,
        "actual_status": status,
        "ssh_host": rental.ssh_host,
        "elapsed_seconds": round(max(0.0, end - rental.billed_from), 3),
        "estimated_cost": estimate,
        "cost": spent,
        "cost_kind": kind,
        "rentals": rentals,
    }
