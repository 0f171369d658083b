"""Airflow names imported in one place, so one provider serves Airflow 2.11 and Airflow 3.

The names that moved between Airflow 2 (``airflow.models``, ``airflow.hooks``, ``airflow.decorators``) and 3
(``airflow.sdk``) come through ``apache-airflow-providers-common-compat``, as in the official providers; the
trigger bases did not move. Names resolve lazily (PEP 562): a DAG file that imports an operator does not pay for
the trigger or hook bases.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

_COMMON_COMPAT = "airflow.providers.common.compat.sdk"
# name -> the module it comes from
_WHERE = {
    "BaseHook": _COMMON_COMPAT,
    "BaseOperator": _COMMON_COMPAT,
    "BaseSensorOperator": _COMMON_COMPAT,
    "PokeReturnValue": _COMMON_COMPAT,
    "AirflowException": _COMMON_COMPAT,
    "AirflowFailException": _COMMON_COMPAT,
    "AirflowNotFoundException": _COMMON_COMPAT,
    "AirflowTaskTimeout": _COMMON_COMPAT,
    "TaskDeferred": _COMMON_COMPAT,
    "mask_secret": _COMMON_COMPAT,
    "Variable": _COMMON_COMPAT,
    "BaseNotifier": _COMMON_COMPAT,
    "DecoratedOperator": _COMMON_COMPAT,
    "task_decorator_factory": _COMMON_COMPAT,
    "get_current_context": _COMMON_COMPAT,
    # Airflow 2.11's Dataset under its Airflow 3 name, and the metrics client (loaded only when a metric is sent).
    "Asset": _COMMON_COMPAT,
    "Stats": _COMMON_COMPAT,
    "BaseTrigger": "airflow.triggers.base",
    "TriggerEvent": "airflow.triggers.base",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def airflow_version() -> tuple[int, int]:
    """The running Airflow's major and minor version, e.g. (3, 2)."""
    from airflow import __version__

    major, minor = re.findall(r"\d+", __version__)[:2]  # "3.1.0rc1" -> (3, 1)
    return int(major), int(minor)


def get_variable(key: str, default: Any = None) -> Any:
    """A Variable's value through Airflow's secrets backends: the Task SDK's read in an Airflow 3 task, else the
    models' (the api-server, Airflow 2, ``dag.test()``)."""
    import sys

    task_runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    if hasattr(task_runner, "SUPERVISOR_COMMS"):  # in an Airflow 3 task: the models' read warns there
        from airflow.sdk import Variable
    else:
        from airflow.models import Variable  # type: ignore[assignment]
    return Variable.get(key, default)  # the default is positional: Airflow 2 and 3 name it differently


def is_airflow_2() -> bool:
    """True on Airflow 2 (2.11), where some Airflow 3 features are missing (the README's guarantee table)."""
    return airflow_version()[0] == 2


def has_retry_policies() -> bool:
    """True from Airflow 3.3, whose tasks take a ``retry_policy`` (AIP-105)."""
    return airflow_version() >= (3, 3)


def pauses() -> tuple[type[BaseException], ...]:
    """What a task raises to wait without failing: ``TaskDeferred``, and from Airflow 3.3 ``TaskAwaitingInput``."""
    try:
        from airflow.sdk.exceptions import TaskAwaitingInput
    except ImportError:
        return (__getattr__("TaskDeferred"),)
    return (__getattr__("TaskDeferred"), TaskAwaitingInput)


def triggerer_calls_on_kill() -> bool:
    """True from Airflow 3.3, whose triggerer calls a trigger's ``on_kill``.

    It does so when a user marks the deferred task failed or clears it. Earlier Airflow versions run only ``cleanup``,
    for that and for every other reason a trigger stops.
    """
    return airflow_version() >= (3, 3)
