"""What a task's earlier runs in Airflow's own history tell the expected-cost choice and deadlines by default.

Each renting task records its rentals (``ui/records.py``): when the instance was created and first seen running,
when it stopped (its job's wrapper stops it) or was destroyed, its image and its offer's download speed. From the
records of the task's latest successful task instances:

- the job's running time: the median over the latest rental of each, from running to stopped, so the boot is left
  out (the choice prices boots on its own). Only when none of them recorded a rental with those times (rentals made
  by an earlier version of the provider, records that could not be written) are their task instance durations used,
  boot and staging included;
- the image's size: the median of what each rental's boot implies at its offer's download speed
  (``offer_cost.image_gb_from_boot``), over every rental of the same image that was seen running, for the
  expected-cost choice; and the largest, for a deadline, which must not take a host that had the image already for
  a typical one. A boot is seen at a read, up to one poll interval late, so the figures err large.

Like host memory (``host_memory.py``) this module runs where the metadata database may be used: in the task on
Airflow 2, in the api-server on Airflow 3 (``ui/history_api.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from airflow_gpumarket import columns, offer_cost
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.ui.records import (
    END_KEY_PREFIX,
    RECORD_KEY_PREFIX,
    URL_XCOM_KEY,
    number,
    stored_value,
    xcom_model,
)

#: The task's latest successful task instances (mapped ones each count) the median is taken over.
RECENT_RUNS = 20

TiKey = tuple[str, str, str, int]  # dag_id, run_id, task_id, map_index


class Learned(NamedTuple):
    """What the task's latest successes tell of its next run; None where they tell nothing."""

    runtime: float | None = None  # the job's running time, in seconds
    image_gb: float | None = None  # its image's size, in GB: the median its boots imply
    image_gb_max: float | None = None  # the largest its boots imply


#: The longest image reference asked about (registry, path, tag and digest).
IMAGE_CHARS = 1000


def check_task(dag_id: Any, task_id: Any) -> tuple[str, str]:
    """``dag_id`` and ``task_id`` as given; GpuMarketValidationError naming the one that is not an id Airflow
    stores (a non-empty string of at most 250 characters, without NUL or a lone surrogate)."""
    return columns.string("dag_id", dag_id), columns.string("task_id", task_id)


def check_image(image: Any) -> str | None:
    """``image`` as given (None: not asked); GpuMarketValidationError when it is not a non-blank string of at most
    ``IMAGE_CHARS``, storable."""
    if isinstance(image, str) and not image.strip():
        raise GpuMarketValidationError("image", "must be a non-empty string or null")
    return columns.string("image", image, required=False, max_chars=IMAGE_CHARS)


def job_seconds(records: Iterable[Mapping[str, Any]]) -> float | None:
    """The job's running time in one task instance's rental records: its latest rental's, from first seen running
    until seen stopped (else destroyed); None when no rental ran to an end."""
    ran = [r for r in records if number(r.get("running_at")) is not None and not r.get("end_only")]
    if not ran:
        return None
    latest = max(ran, key=lambda r: number(r.get("created_at")) or 0.0)
    running_at = number(latest["running_at"])
    end = number(latest.get("stopped_at"))
    end = end if end is not None else number(latest.get("ended_at"))
    if running_at is None or end is None or end < running_at:
        return None
    return end - running_at


def image_gb(records: Iterable[Mapping[str, Any]], image: str) -> list[float]:
    """The image size each rental of ``image`` in ``records`` implies: its boot at its offer's download speed."""
    sizes = []
    for r in records:
        created, running, down = number(r.get("created_at")), number(r.get("running_at")), number(r.get("inet_down"))
        if r.get("image") != image or r.get("end_only") or created is None or running is None:
            continue
        if down is not None and down > 0 and running >= created:
            sizes.append(offer_cost.image_gb_from_boot(running - created, down))
    return sizes


def median_of(
    durations: Mapping[TiKey, float | None], records: Mapping[TiKey, list[Mapping[str, Any]]]
) -> float | None:
    """The median job running time of these task instances (``durations``: theirs, by task instance, when known),
    from their records when any has one, else the median of their durations; None when there is neither."""
    from_records = [s for ti in durations if (s := job_seconds(records.get(ti, ()))) is not None]
    figures = from_records or [d for d in durations.values() if d is not None]
    return float(statistics.median(figures)) if figures else None


def learned(engine: Any, dag_id: str, task_id: str, image: str | None = None, *, last: int = RECENT_RUNS) -> Learned:
    """What the task's ``last`` latest successful task instances tell: the median job running time, and (given
    ``image``) the median and largest sizes their boots of it imply; ``Learned()`` when it has never succeeded."""
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import select, tuple_
    from sqlalchemy.orm import Session

    check_task(dag_id, task_id)
    check_image(image)
    xcom = xcom_model()
    with Session(engine) as session:
        rows = session.execute(
            select(TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.duration, TI.start_date, TI.end_date)
            .where(TI.dag_id == dag_id, TI.task_id == task_id, TI.state == "success", TI.end_date.is_not(None))
            .order_by(TI.end_date.desc())
            .limit(last)
        ).all()
        durations = {(d, r, t, int(m)): _duration(took, start, end) for d, r, t, m, took, start, end in rows}
        if not durations:
            return Learned()
        found = session.scalars(
            select(xcom).where(
                tuple_(xcom.dag_id, xcom.run_id, xcom.task_id, xcom.map_index).in_(list(durations)),
                xcom.key.like(f"{RECORD_KEY_PREFIX}%"),
                xcom.key.not_like(f"{END_KEY_PREFIX}%"),
                xcom.key != URL_XCOM_KEY,
            )
        ).all()
        records: dict[TiKey, list[Mapping[str, Any]]] = {}
        for row in found:
            value = stored_value(xcom, row)
            if isinstance(value, dict):
                records.setdefault((row.dag_id, row.run_id, row.task_id, int(row.map_index)), []).append(value)
    sizes = [] if image is None else [size for rs in records.values() for size in image_gb(rs, image)]
    if not sizes:
        return Learned(median_of(durations, records))
    return Learned(median_of(durations, records), float(statistics.median(sizes)), max(sizes))


def _duration(took: Any, start: Any, end: Any) -> float | None:
    """A task instance's duration in seconds: as Airflow stored it, else from its start to its end, when known."""
    if number(took) is not None:
        return max(0.0, float(took))
    return max(0.0, (end - start).total_seconds()) if start is not None and end is not None else None
