"""A task's earlier running times, read from Airflow's own history: what the expected-cost choice assumes by default.

The figure is the job's own running time, not the task instance's duration: each renting task records its rentals
(``ui/records.py``) with when the instance was first seen running and when it stopped (its job's wrapper stops it)
or was destroyed, so the boot, which the choice prices on its own from the image's size, is left out. Only when none
of the task's recent successes recorded a rental with those times (rentals made by an earlier version of the
provider, records that could not be written) are their task instance durations used, boot and staging included.
Like host memory (``host_memory.py``) this module runs where the metadata database may be used: in the task on
Airflow 2, in the api-server on Airflow 3 (``ui/host_memory_api.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

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


def check_task(dag_id: Any, task_id: Any) -> tuple[str, str]:
    """``dag_id`` and ``task_id`` as given; GpuMarketValidationError naming the one that is not a non-empty string."""
    for name, value in (("dag_id", dag_id), ("task_id", task_id)):
        if not isinstance(value, str) or not value:
            raise GpuMarketValidationError(name, f"must be a non-empty string, got {value!r}")
    return dag_id, task_id


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


def median_of(
    durations: Mapping[TiKey, float | None], records: Mapping[TiKey, list[Mapping[str, Any]]]
) -> float | None:
    """The median job running time of these task instances (``durations``: theirs, by task instance, when known),
    from their records when any has one, else the median of their durations; None when there is neither."""
    from_records = [s for ti in durations if (s := job_seconds(records.get(ti, ()))) is not None]
    figures = from_records or [d for d in durations.values() if d is not None]
    return float(statistics.median(figures)) if figures else None


def median_runtime(engine: Any, dag_id: str, task_id: str, *, last: int = RECENT_RUNS) -> float | None:
    """The median running time, in seconds, of the task's ``last`` latest successful task instances; None when it has
    never succeeded."""
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import select, tuple_
    from sqlalchemy.orm import Session

    check_task(dag_id, task_id)
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
            return None
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
    return median_of(durations, records)


def _duration(took: Any, start: Any, end: Any) -> float | None:
    """A task instance's duration in seconds: as Airflow stored it, else from its start to its end, when known."""
    if number(took) is not None:
        return max(0.0, float(took))
    return max(0.0, (end - start).total_seconds()) if start is not None and end is not None else None
