"""Airflow names imported in one place, so Airflow 2.11 support can be added here without touching the rest.

Airflow 3 exposes the authoring interface under ``airflow.sdk``; 2.x keeps it in ``airflow.models``/``airflow.hooks``.
Names resolve lazily (PEP 562): a DAG file that imports an operator does not pay for the trigger or hook bases.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (Airflow 3 module, Airflow 2.11 module)
_WHERE = {
    "BaseHook": ("airflow.sdk", "airflow.hooks.base"),
    "BaseOperator": ("airflow.sdk", "airflow.models"),
    "BaseSensorOperator": ("airflow.sdk", "airflow.sensors.base"),
    "PokeReturnValue": ("airflow.sdk", "airflow.sensors.base"),
    "AirflowException": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "AirflowFailException": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "AirflowTaskTimeout": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "TaskDeferred": ("airflow.sdk.exceptions", "airflow.exceptions"),
    "mask_secret": ("airflow.sdk.log", "airflow.utils.log.secrets_masker"),
    "DecoratedOperator": ("airflow.sdk.bases.decorator", "airflow.decorators.base"),
    "task_decorator_factory": ("airflow.sdk.bases.decorator", "airflow.decorators.base"),
    "BaseTrigger": ("airflow.triggers.base", "airflow.triggers.base"),
    "TriggerEvent": ("airflow.triggers.base", "airflow.triggers.base"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    current, legacy = _WHERE[name]
    try:
        value = getattr(importlib.import_module(current), name)
    except (ImportError, AttributeError):  # Airflow 2.11
        value = getattr(importlib.import_module(legacy), name)
    globals()[name] = value
    return value
