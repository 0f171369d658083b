"""A task instance's XComs, read and written from a triggerer, where no ``xcom_push`` or ``xcom_pull`` exists.

Through the Task SDK on Airflow 3 (its triggerer has no database), the metadata database on 2.11. Blocking: a
trigger calls these in a thread.
"""

from __future__ import annotations

from typing import Any

from airflow_gpumarket._compat import is_airflow_2


def _names(ti: Any) -> dict[str, Any]:
    return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": getattr(ti, "map_index", -1)}


def set_value(ti: Any, key: str, value: Any) -> None:
    """Store ``value`` under ``key`` on the task instance ``ti`` names."""
    if is_airflow_2():
        from airflow.models.xcom import XCom

        XCom.set(key=key, value=value, **_names(ti))
        return
    from airflow.sdk.execution_time.xcom import XCom as SdkXCom

    SdkXCom.set(key, value, **_names(ti))


def get_value(ti: Any, key: str) -> Any:
    """The value stored under ``key`` on the task instance ``ti`` names, or None."""
    if is_airflow_2():
        from airflow.models.xcom import XCom

        return XCom.get_one(key=key, **_names(ti))
    from airflow.sdk.execution_time.xcom import XCom as SdkXCom

    return SdkXCom.get_one(key=key, **_names(ti))
