"""What a renting task records of its rentals, for the "GPU rentals" page and the task's "GPU rental" link.

A task instance writes one XCom per rental (``record_key(instance_id)``; a failover or a preemption adds one) when
the instance is created or adopted, and writes it again when the instance is destroyed, with what it cost; and
``URL_XCOM_KEY``, the page's row of its latest rental, which the link reads. The page matches live instances to
DAG, run and task through these records, never by guessing from labels; spend per DAG comes from them too. The
records are small plain JSON (no instance key, no SSH address).

Importing this module is cheap: operators import it on every DAG parse.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import lifecycle
from airflow_gpumarket._compat import is_airflow_2

#: The XCom keys of a task instance's rental records: this prefix and the instance id.
RECORD_KEY_PREFIX = "gpumarket_rental_"
#: The XCom key of the page's row of the task instance's latest rental (what the "GPU rental" link opens).
URL_XCOM_KEY = "gpumarket_rental_url"
#: The URL path of the page, relative to the Airflow UI's base URL (no leading slash: it works behind a proxy).
PAGE_PATH = "gpumarket/"


def record_key(instance_id: int) -> str:
    return f"{RECORD_KEY_PREFIX}{int(instance_id)}"


def rental_url(instance_id: int) -> str:
    """The page's row for one instance, relative to the Airflow UI's base URL."""
    return f"{PAGE_PATH}?instance={int(instance_id)}#rental-{int(instance_id)}"


def started(
    *,
    instance_id: int,
    conn_id: str,
    offer_id: int | None,
    gpu_name: str | None,
    hourly_price: float | None,
    bid: float | None,
    created_at: float,
    try_number: int | None,
    handed_over: bool = False,
) -> dict[str, Any]:
    """A rental's record when its instance was created."""
    return {
        "instance_id": int(instance_id),
        "conn_id": conn_id,
        "offer_id": offer_id,
        "gpu_name": gpu_name,
        "hourly_price": hourly_price,
        "interruptible": bid is not None,
        "created_at": round(created_at, 3),
        "try_number": try_number,
        "handed_over": handed_over,
        "ended_at": None,
        "cost": None,
    }


#: Digits a recorded cost keeps: a short job on a cheap offer costs fractions of a cent.
COST_DIGITS = 6


def price_of(record: Mapping[str, Any]) -> float | None:
    """The record's hourly price, or None when it holds none (records are read back from XCom)."""
    price = record.get("hourly_price")
    return float(price) if isinstance(price, int | float) and not isinstance(price, bool) else None


def ended(record: Mapping[str, Any], ended_at: float | None = None) -> dict[str, Any]:
    """The record once its instance is destroyed: when, and what it cost (at its hourly price from creation: an
    upper bound, since a booting or stopped instance bills storage only)."""
    end = time.time() if ended_at is None else ended_at
    cost = lifecycle.estimated_cost(price_of(record), end - float(record["created_at"]), digits=COST_DIGITS)
    return {**record, "ended_at": round(end, 3), "cost": cost}


class RentalRecorder:
    """Writes a task instance's rental records to its XComs. Best effort: a task whose XCom cannot be written (a
    test's bare context, a backend error) still runs its job, and its rental is still destroyed; only the page
    loses sight of it."""

    def __init__(self, context: Any, log: Any, conn_id: str) -> None:
        self._ti = context.get("ti") if isinstance(context, Mapping) else None
        self._log = log
        self._conn_id = conn_id
        self._open: dict[int, dict[str, Any]] = {}

    def start(self, rental: Any, *, write: bool = True, handed_over: bool = False) -> None:
        """A rental this try holds (``write=False``: one whose start an earlier run of this try wrote, resumed
        after a deferral; ``handed_over``: the task hands the instance to later tasks of its DAG run)."""
        number = getattr(self._ti, "try_number", None)
        record = started(
            instance_id=rental.instance_id,
            conn_id=self._conn_id,
            offer_id=rental.offer_id,
            gpu_name=rental.gpu_name,
            hourly_price=rental.hourly_price,
            bid=rental.bid,
            created_at=rental.created_at,
            try_number=number if isinstance(number, int) else None,
            handed_over=handed_over,
        )
        self._open[rental.instance_id] = record
        if write:
            self._push(record_key(rental.instance_id), record)
            url = rental_url(rental.instance_id)
            self._push(URL_XCOM_KEY, url)
            if not is_airflow_2():
                # Airflow 3 stores a link's address when the task's process ends or defers; written now as well,
                # a task still running in its worker has its link.
                from airflow_gpumarket.ui.links import GpuRentalLink

                self._push(GpuRentalLink().xcom_key, url)

    def end(self, instance_id: int) -> None:
        """The rental's instance is destroyed (by this task, or by its own job)."""
        record = self._open.pop(instance_id, None)
        if record is not None:
            self._push(record_key(instance_id), ended(record))

    def _push(self, key: str, value: Any) -> None:
        push = getattr(self._ti, "xcom_push", None)
        if push is None:
            return
        try:
            push(key=key, value=value)
        except Exception as exc:  # noqa: BLE001 - the page is a view; the job and its destroy go on
            self._log.warning("Could not record the rental for the GPU rentals page: %s", exc)
