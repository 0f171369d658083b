"""What a rental cost, as its task reports and settles it: the service's charge when it lists one, else an estimate.

Every figure is on the service's clock (the worker's clock says nothing of what the service bills), and every message
says which kind it is: ``CHARGED`` (read from the service's charges once the instance is gone) or ``ESTIMATED``
(``budgets.rental_cost`` from the rental's price, disk and billing marks). A budget's reservation is the third kind,
a worst case (``budgets.worst_case``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_gpumarket.budgets import CHARGED, ESTIMATED

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle

__all__ = ["CHARGED", "ESTIMATED", "breakdown", "charged", "charged_since", "settle", "text", "total"]


#: A charge posted up to this many seconds (service time) before a rental's end is its whole cost; one posted
#: earlier is partial (the service posts charges after they accrue), and the estimate stands instead.
POSTED_TOLERANCE_SECONDS = 300.0


def charged(hook: Any, instance_id: int, start: float, end: float) -> float | None:
    """What the service charged for one instance from ``start`` to ``end``, the service's times.

    None when it lists none, or when its charges are posted only up to well before ``end`` (not the whole cost).
    """
    try:
        charges = hook.charges(start, end, types=("instance",))
    except Exception:  # noqa: BLE001 - no charges endpoint, no answer: the estimate stands (a destroy path never fails here)
        return None
    mine = [c for c in charges if c.instance_id == instance_id]
    posted = max((c.end for c in mine if c.end is not None), default=None)
    if not mine or (posted is not None and posted < end - POSTED_TOLERANCE_SECONDS):
        return None
    return sum(c.amount for c in mine)


def charged_since(hook: Any, instance_id: int, started: Any, ended: float) -> float | None:
    """``charged`` from an instance's ``start_date`` as a listing gave it; None when it gave none."""
    from airflow_gpumarket import api

    if not api.is_positive_number(started):
        return None
    return charged(hook, instance_id, min(float(started), ended), ended)


def settle(hook: Any, rental: lifecycle.Rental, ended: float, *, read_charge: bool = True) -> None:
    """The rental's instance is gone at ``ended`` (the service's time): its cost is the charge, else the estimate."""
    rental.ended_at = ended
    figure = charged(hook, rental.instance_id, rental.billed_from, ended) if read_charge else None
    if figure is not None:
        rental.cost, rental.cost_kind = figure, CHARGED
    elif (estimate := rental.cost_until(ended, digits=6)) is not None:
        rental.cost, rental.cost_kind = estimate, ESTIMATED


def text(dollars: float | None, kind: str | None) -> str:
    """A cost for a message, saying which kind it is."""
    if dollars is None:
        return "unknown (no price)"
    if kind == CHARGED:
        return f"${dollars:.4f}, charged by the service"
    return f"about ${dollars:.4f}, estimated on the service's clock"


def total(rentals: list[dict[str, Any]]) -> tuple[float | None, str]:
    """What a task's rentals (``{"cost", "cost_kind"}`` each) cost together: charged only when each one's is."""
    known = [r["cost"] for r in rentals if r.get("cost") is not None]
    if not known:
        return None, ESTIMATED
    everyone = len(known) == len(rentals) and all(r.get("cost_kind") == CHARGED for r in rentals)
    return round(sum(known), 6), CHARGED if everyone else ESTIMATED


def rate(rentals: list[dict[str, Any]], hourly: Any) -> str:
    """The last rental's rate for a message after a total, said to be the last's when there were more."""
    return f"{'the last ' if len(rentals) > 1 else ''}at ${hourly}/h, disk included"


def breakdown(rentals: list[dict[str, Any]]) -> str:
    """For a message after a total: each rental's own figure, when there was more than one."""
    if len(rentals) < 2:
        return ""
    each = ", ".join(
        f"instance {r['instance_id']} "
        + ("unknown" if r.get("cost") is None else f"${r['cost']:.4f} {r.get('cost_kind') or ESTIMATED}")
        for r in rentals
    )
    return f" over {len(rentals)} rentals ({each})"
