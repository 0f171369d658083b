"""A retry's reconnection: which instance an earlier try of the task instance left that this try takes back.

What earlier tries rented carries the task instance's label key (``lifecycle.rental_key``); a durable task also
saved the one it held in the task state store (Airflow 3.3+), which is taken first. One booting or running is
taken back, or one stopped after its job printed exit status 0 (its success is read from the log rather than run
again); the session ends the others (``RentalSession.adopt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpumarket import api, job_logs, lifecycle
from airflow_gpumarket.exceptions import GpuMarketError

if TYPE_CHECKING:
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook


#: The task state store's key (Airflow 3.3+) of the rental a task instance holds: a retry reconnects to it.
STATE_KEY = "gpumarket_rental"


class Choice(NamedTuple):
    """What earlier tries left: the instance taken back (None: rent anew), and the ids of those to end."""

    adopted: Mapping[str, Any] | None
    leftovers: list[int]


def choose(hook: GpuMarketHook, log: Any, key: str, saved: Any, *, waits_for_job: bool) -> Choice:
    """Among the instances carrying ``key``, the one a retry takes back and the ones it ends.

    ``saved``: the task state store's entry (``RentalSession``), whose instance is taken first.
    """
    earlier = lifecycle.rentals_of(hook.list_instances(), key)
    saved_id = saved_instance(saved)
    if saved_id is not None:  # reconnect to the one an earlier try saved first; the label finds any other
        log.info("Retry: the task state store names instance %s, rented by an earlier try", saved_id)
        earlier = sorted(earlier, key=lambda instance: instance.get("id") == saved_id)
    adopted, leftovers = None, []
    for instance in reversed(earlier):
        if adopted is None and _may_adopt(hook, log, instance, waits_for_job):
            adopted = instance
        else:
            leftovers.append(int(instance["id"]))
    if adopted is not None:
        log.warning(
            "Retry: adopting instance %s (status %r) rented by an earlier try instead of renting again",
            adopted["id"],
            adopted.get("actual_status"),
        )
    return Choice(adopted, leftovers)


def rental_of(instance: Mapping[str, Any], *, lease: float, now: float) -> lifecycle.Rental:
    """The ``Rental`` of an instance an earlier try made, as this try holds it (``lease``: the whole lease)."""
    created_at = lifecycle.started_at(instance, fallback=now, now=now)
    offer_id = instance.get("offer_id")
    start = instance.get("start_date")
    return lifecycle.Rental(
        instance_id=int(instance["id"]),
        offer_id=offer_id,
        dph_total=instance.get("dph_total"),
        gpu_name=instance.get("gpu_name"),
        label=instance.get("label"),
        created_at=created_at,
        lease_cap=created_at + lease,
        bid=instance.get("bid_price") if instance.get("is_bid") else None,
        machine_id=instance.get("machine_id"),
        attempts=lifecycle.Attempts(tried=[] if offer_id is None else [int(offer_id)]),
        recorded_at=start if api.is_positive_number(start) else None,
    )


def saved_instance(saved: Any) -> int | None:
    """The instance id in a task state store entry, if it holds one."""
    found = saved.get("instance_id") if isinstance(saved, Mapping) else None
    return found if isinstance(found, int) else None


def _may_adopt(hook: GpuMarketHook, log: Any, instance: Mapping[str, Any], waits_for_job: bool) -> bool:
    status = instance.get("actual_status")
    if api.is_booting(status) or status == api.STATUS_RUNNING:
        return True
    return status == api.STATUS_STOPPED and waits_for_job and _job_succeeded(hook, log, instance)


def _job_succeeded(hook: GpuMarketHook, log: Any, instance: Mapping[str, Any]) -> bool:
    """Whether a stopped instance's log ends with exit status 0; a log that cannot be read proves nothing."""
    try:
        text = hook.get_instance_logs(int(instance["id"]))
    except GpuMarketError as exc:
        log.warning("Cannot read the log of instance %s to see how its job ended (%s)", instance["id"], exc)
        return False
    return job_logs.exit_status(job_logs.split_lines(text, complete_only=False)) == 0
