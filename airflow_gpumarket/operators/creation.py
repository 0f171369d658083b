"""The spec's creation fields as a renting operator takes them: one ``instance`` dict, each field also by name."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError

#: Creation fields whose templated (Jinja) value cannot be checked before rendering (plain text fields can).
TYPED_FIELDS = tuple(field.name for field in api.CREATION_FIELDS if not field.text)
#: What the renting operators send unless told otherwise: a taken offer then fails at once and the next is tried.
CREATION_DEFAULTS: Mapping[str, Any] = {"cancel_unavail": True}


def creation_fields(
    instance: Mapping[str, Any] | None, named: Mapping[str, Any], *, command: str | None = None
) -> dict[str, Any]:
    """The creation fields a renting operator sends: ``CREATION_DEFAULTS``, then the ``instance`` dict, then the
    fields given by name (a name wins over the dict, as Databricks' named arguments win over ``json``). A
    ``command`` stands for ``onstart`` (the provider writes the script) and makes ``runtype`` default to
    ``ssh_proxy``. Values may still be Jinja or an upstream task's output; they are checked once rendered."""
    if instance is None:
        instance = {}
    if not isinstance(instance, Mapping):
        raise GpuMarketValidationError(
            "instance",
            f"must be a dict of the spec's creation fields, e.g. {{'image': 'pytorch/pytorch', 'disk': 40}}; got "
            f"{type(instance).__name__} (a field's value may be templated, the dict itself may not)",
        )
    if "label" in instance:
        raise GpuMarketValidationError(
            "instance", "has a 'label': the operator writes the label (it ties the instance to the task); remove it"
        )
    api.check_creation_field_names(instance)
    fields = {**CREATION_DEFAULTS, **instance, **named}
    if command is not None:
        if fields.get("onstart") is not None:
            raise GpuMarketValidationError("onstart", "give command (wrapped by the provider) or onstart, not both")
        if fields.get("runtype") is None:
            fields["runtype"] = "ssh_proxy"
    return fields


def takes_creation_fields(init: Any) -> Any:
    """Declare every field of ``api.CREATION_FIELDS`` as a keyword-only parameter of ``init``, which receives them
    in ``**kwargs``. ``help()``, Airflow's ``default_args`` and ``.expand()``'s check of names read this signature,
    so a field added to the table is taken by name with nothing else to change."""
    signature = inspect.signature(init)
    *params, var_keyword = signature.parameters.values()
    fields = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=CREATION_DEFAULTS.get(name))
        for name in api.CREATION_FIELD_NAMES
    ]
    init.__signature__ = signature.replace(parameters=[*params, *fields, var_keyword])
    return init
