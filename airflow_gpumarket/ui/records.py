"""What a renting task records of its rentals, for the "GPU rentals" page and the task's "GPU rental" link.

A task instance writes one XCom per rental (``record_key(instance_id)``; a failover or a preemption adds one) when
the instance is created or adopted, and writes it again when the instance is destroyed, with what it cost; and
``URL_XCOM_KEY``, the page's row of its latest rental, which the link reads. Whatever else ends a rental (the
teardown task, the reaper, the trigger of a task marked failed, the page's Destroy) writes an end record
(``end_key(instance_id)``) where it can. Every time in a record is on the service's clock. The records are small
plain JSON (no instance key, no SSH address).

Importing this module is cheap: operators import it on every DAG parse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_gpumarket import api, budgets
from airflow_gpumarket._compat import is_airflow_2
from airflow_gpumarket.utils import RunTimeModule

metrics = RunTimeModule("airflow_gpumarket.metrics")

#: The XCom keys of a task instance's rental records: this prefix and the instance id.
RECORD_KEY_PREFIX = "gpumarket_rental_"
#: The XCom keys of the end of a rental written by something other than its renter (it carries ``end_only``).
END_KEY_PREFIX = f"{RECORD_KEY_PREFIX}end_"
#: The XCom keys a task that reached a rented service writes (``connect_service``): this prefix and the instance id.
USE_KEY_PREFIX = "gpumarket_service_use_"
#: The XCom key of the page's row of the task instance's latest rental (what the "GPU rental" link opens).
URL_XCOM_KEY = "gpumarket_rental_url"
#: The URL path of the page, relative to the Airflow UI's base URL (no leading slash: it works behind a proxy).
PAGE_PATH = "gpumarket/"


def record_key(instance_id: int) -> str:
    return f"{RECORD_KEY_PREFIX}{int(instance_id)}"


def end_key(instance_id: int) -> str:
    return f"{END_KEY_PREFIX}{int(instance_id)}"


def use_key(instance_id: int) -> str:
    return f"{USE_KEY_PREFIX}{int(instance_id)}"


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
    disk_hourly: float = 0.0,
    image: str | None = None,
    inet_down: float | None = None,
) -> dict[str, Any]:
    """A rental's record when its instance was created (``image`` and the offer's ``inet_down``: what its boot
    tells of the image's size, ``task_history``)."""
    return {
        "instance_id": int(instance_id),
        "conn_id": conn_id,
        "offer_id": offer_id,
        "gpu_name": gpu_name,
        "hourly_price": hourly_price,
        "disk_hourly": round(disk_hourly, 6),
        "image": image if isinstance(image, str) else None,
        "inet_down": inet_down,
        "interruptible": bid is not None,
        "created_at": round(created_at, 3),
        "try_number": try_number,
        "handed_over": handed_over,
        "running_at": None,
        "stopped_at": None,
        "ended_at": None,
        "cost": None,
    }


#: Digits a recorded cost keeps: a short job on a cheap offer costs fractions of a cent.
COST_DIGITS = 6


def number(value: Any) -> float | None:
    """A value read back from XCom as a float, or None when it is no number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def price_of(record: Mapping[str, Any]) -> float | None:
    """The record's hourly price, or None when it holds none."""
    return number(record.get("hourly_price"))


def ended(record: Mapping[str, Any], ended_at: float) -> dict[str, Any]:
    """The record once its instance is destroyed: when, and its estimated cost (``budgets.rental_cost``)."""
    cost = budgets.rental_cost(
        price_of(record),
        created_at=number(record.get("created_at")),
        running_at=number(record.get("running_at")),
        stopped_at=number(record.get("stopped_at")),
        ended_at=ended_at,
        disk_hourly=number(record.get("disk_hourly")) or 0.0,
        digits=COST_DIGITS,
    )
    return {**record, "ended_at": round(ended_at, 3), "cost": cost}


def end_only(
    *,
    instance_id: int,
    ended_at: float,
    ended_by: str,
    instance: Mapping[str, Any] | None = None,
    running_at: float | None = None,
    stopped_at: float | None = None,
) -> dict[str, Any]:
    """The end of a rental, as written by what destroyed it when that is not its renter.

    ``instance``: the service's instance read before the destroy, whose label, start and price let the page cost and
    attribute a rental whose own record is missing; ``running_at``, ``stopped_at``: what a watcher saw of it (a
    trigger).
    """
    seen = instance or {}
    start = seen.get("start_date")
    price = seen.get("bid_price") if seen.get("is_bid") else seen.get("dph_total")
    return {
        "instance_id": int(instance_id),
        "end_only": True,
        "ended_at": round(ended_at, 3),
        "ended_by": ended_by,
        "label": seen.get("label"),
        "created_at": start if api.is_positive_number(start) else None,
        "running_at": running_at,
        "stopped_at": stopped_at,
        "hourly_price": price if api.is_positive_number(price) else None,
        "gpu_name": seen.get("gpu_name"),
        "offer_id": seen.get("offer_id"),
    }


def push_end(
    context: Any, log: Any, hook: Any, instance_id: int, *, ended_by: str, instance: Mapping[str, Any] | None = None
) -> None:
    """Store the end of a rental just destroyed on the running task instance's XComs, best effort."""
    record = end_only(instance_id=instance_id, ended_at=hook.service_now(), ended_by=ended_by, instance=instance)
    _push(context.get("ti") if isinstance(context, Mapping) else None, log, end_key(instance_id), record)


def push_use(context: Any, log: Any, instance_id: int, used_at: float) -> None:
    """Store on the running task instance's XComs that it reached the service of ``instance_id``, best effort."""
    record = {"instance_id": int(instance_id), "used_at": round(used_at, 3)}
    _push(context.get("ti") if isinstance(context, Mapping) else None, log, use_key(instance_id), record)


def xcom_model() -> Any:
    """The XCom table's model: ``XComModel`` on Airflow 3, ``BaseXCom`` on 2.11."""
    import airflow.models.xcom as xcom

    return getattr(xcom, "XComModel", None) or xcom.BaseXCom


def stored_value(model: Any, row: Any) -> Any:
    """An XCom row's value, read from the table: 2.11's rows deserialize theirs as they load, Airflow 3's are asked."""
    return row.value if is_airflow_2() else model.deserialize_value(row)


def write_end(ti: Any, record: Mapping[str, Any]) -> None:
    """Store an end record on the task instance ``ti`` names, from a triggerer (no ``xcom_push`` there)."""
    from airflow_gpumarket import task_xcom

    task_xcom.set_value(ti, end_key(record["instance_id"]), dict(record))


class RentalRecorder:
    """Writes a task instance's rental records to its XComs.

    Best effort: a task whose XCom cannot be written (a test's bare context, a backend error) still runs its job, and
    its rental is still destroyed; only the page loses sight of it.
    """

    def __init__(self, context: Any, log: Any, conn_id: str, clock: Callable[[], float], *, image: Any = None) -> None:
        self._ti = context.get("ti") if isinstance(context, Mapping) else None
        self._log = log
        self._conn_id = conn_id
        self._clock = clock
        self._image = image  # the rentals' image, rendered
        self._open: dict[int, tuple[dict[str, Any], Any]] = {}  # instance id -> (its record, its lifecycle.Rental)
        self.recorded = False  # whether this try holds a rental whose address its XCom has
        self.latest: tuple[dict[str, Any], Any] | None = None  # the latest rental's record and Rental (lineage)

    def start(self, rental: Any, *, write: bool = True, handed_over: bool = False) -> None:
        """Record a rental this try holds, created now or adopted.

        ``write=False``: one whose start an earlier run of this try wrote, resumed after a deferral; ``handed_over``:
        the task hands the instance to later tasks of its DAG run. Its start is ``rental.recorded_at`` when known, else
        the service's time now.
        """
        number = getattr(self._ti, "try_number", None)
        self.recorded = True
        if rental.recorded_at is None:
            rental.recorded_at = self._clock()
        record = started(
            instance_id=rental.instance_id,
            conn_id=self._conn_id,
            offer_id=rental.offer_id,
            gpu_name=rental.gpu_name,
            hourly_price=rental.hourly_price,
            disk_hourly=rental.disk_hourly,
            bid=rental.bid,
            created_at=rental.recorded_at,
            try_number=number if isinstance(number, int) else None,
            handed_over=handed_over,
            image=self._image,
            inet_down=getattr(rental, "inet_down", None),
        )
        self._open[rental.instance_id] = self.latest = (record, rental)
        if rental.running_at is not None:
            record["running_at"] = round(rental.running_at, 3)
        if write:
            self._push(record_key(rental.instance_id), record)
            url = rental_url(rental.instance_id)
            self._push(URL_XCOM_KEY, url)
            if not is_airflow_2():
                # Airflow 3 stores a link's address when the task's process ends or defers; written now as well,
                # a task still running in its worker has its link.
                from airflow_gpumarket.ui.links import GpuRentalLink

                self._push(GpuRentalLink().xcom_key, url)

    def running(self, rental: Any) -> None:
        """Its watcher first saw the rental running (``rental.running_at``): written, so its cost starts there."""
        opened = self._open.get(rental.instance_id)
        if opened is not None and rental.running_at is not None:
            record = opened[0]
            record["running_at"] = round(rental.running_at, 3)
            self._push(record_key(rental.instance_id), record)
            metrics.booted(rental)

    def end(self, instance_id: int) -> None:
        """The rental's instance is destroyed (by this task, or by its own job)."""
        opened = self._open.pop(instance_id, None)
        if opened is None:
            return
        record, rental = opened
        if rental.stopped_at is not None:
            record["stopped_at"] = round(rental.stopped_at, 3)
        record = ended(record, rental.ended_at if getattr(rental, "ended_at", None) is not None else self._clock())
        if getattr(rental, "cost", None) is not None:  # its task's figure: the service's charge, else the same estimate
            record.update(cost=rental.cost, cost_kind=rental.cost_kind)
        self.latest = (record, rental)
        self._push(record_key(instance_id), record)

    def _push(self, key: str, value: Any) -> None:
        _push(self._ti, self._log, key, value)


def _push(ti: Any, log: Any, key: str, value: Any) -> None:
    push = getattr(ti, "xcom_push", None)
    if push is None:
        return
    try:
        push(key=key, value=value)
    except Exception as exc:  # noqa: BLE001 - the page is a view; the job and its destroy go on
        log.warning("Could not record the rental for the GPU rentals page: %s", exc)
