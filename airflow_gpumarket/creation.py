"""The create request as pure functions: the fields a renting operator sends, and the body they make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import api, bidding
from airflow_gpumarket.exceptions import GpuMarketValidationError

#: Creation fields whose templated (Jinja) value cannot be checked before rendering (plain text fields can).
TYPED_FIELDS = tuple(field.name for field in api.CREATION_FIELDS if not field.text)
#: What the renting operators send unless told otherwise: a taken offer then fails at once and the next is tried.
CREATION_DEFAULTS: Mapping[str, Any] = {"cancel_unavail": True}


def creation_fields(
    instance: Mapping[str, Any] | None, named: Mapping[str, Any], *, command: str | None = None
) -> dict[str, Any]:
    """The creation fields sent: ``CREATION_DEFAULTS``, then the ``instance`` dict, then the fields given by name.

    A ``command`` stands for ``onstart`` (the provider writes the script) and makes ``runtype`` default to
    ``ssh_proxy``. Values may still be Jinja or an upstream task's output; they are checked once rendered.
    """
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


def creation_body(
    fields: Mapping[str, Any],
    *,
    onstart: str | None,
    label: str | None,
    bid: float | None = None,
    preemptions: int | None = None,
) -> dict[str, Any]:
    """The create request's body: the fields, the job's script and the bid.

    With ``preemptions`` given, it also tells which run of an interruptible job this is.
    """
    fields = dict(fields)
    if onstart is not None:
        fields["onstart"] = onstart
    if bid is not None:
        fields["price"] = bid
    if preemptions is not None:
        fields["env"] = bidding.job_env(fields.get("env"), preemptions=preemptions)
    return api.build_create_instance_body(label=label, **fields)
