"""Airflow names imported in one place, so Airflow 2.11 support can be added here without touching the rest.

Airflow 3 exposes the authoring interface under ``airflow.sdk``; 2.x keeps it in ``airflow.models``/``airflow.hooks``.
"""

from __future__ import annotations

try:
    from airflow.sdk import BaseHook, BaseOperator, BaseSensorOperator, PokeReturnValue
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
    from airflow.sdk.log import mask_secret
except ImportError:  # Airflow 2.11
    from airflow.exceptions import AirflowException, AirflowFailException, TaskDeferred  # type: ignore
    from airflow.hooks.base import BaseHook  # type: ignore
    from airflow.models import BaseOperator  # type: ignore
    from airflow.sensors.base import BaseSensorOperator, PokeReturnValue  # type: ignore
    from airflow.utils.log.secrets_masker import mask_secret  # type: ignore

from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = [
    "AirflowException",
    "AirflowFailException",
    "TaskDeferred",
    "BaseHook",
    "BaseOperator",
    "BaseSensorOperator",
    "PokeReturnValue",
    "BaseTrigger",
    "TriggerEvent",
    "mask_secret",
]
