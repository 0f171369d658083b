"""The spec's creation fields as a renting operator takes them: one ``instance`` dict, each field also by name."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.interruptible import job_env
from airflow_gpumarket.utils import is_templated

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


class CreationBody:
    """The renting operator's part that writes what a create sends: the creation fields, the job wrapper's script
    for a ``command``, and for an interruptible rental its bid and the run's attempt number. Mixed into
    ``GpuMarketRentingBaseOperator``."""

    instance: dict[str, Any]
    command: Any
    export_env_to_ssh: bool
    interruptible: bool

    def _creation_fields(self, base_url: str | None = None) -> dict[str, Any]:
        """The fields sent; without ``base_url`` (a check before the connection is read) a command's script is
        written only when it might not fit."""
        fields = dict(self.instance)
        if self.command is not None and not (base_url is None and self._script_certainly_fits()):
            fields["onstart"] = self._job_script(base_url or "https://api.example.invalid")
        return fields

    def _script_certainly_fits(self) -> bool:
        from airflow_gpumarket.job_script import certainly_fits

        return (
            isinstance(self.command, str)
            and not self.export_env_to_ssh
            and certainly_fits(self.command, stop_on_success=self._stops_on_success())
        )

    def _job_script(self, base_url: str) -> str | None:
        from airflow_gpumarket.job_script import build_job_onstart

        env = self.instance.get("env")
        if is_templated(self.command) or is_templated(env):
            return None  # checked after rendering, before anything is rented
        names = sorted(api.env_variables(env or {})) if self.export_env_to_ssh else []
        return build_job_onstart(
            self.command,  # type: ignore[arg-type]
            base_url=base_url,
            export_env=names,
            stop_on_success=self._stops_on_success(),
        )

    def _stops_on_success(self) -> bool:
        """Whether the job wrapper stops the instance after exit 0 (so the end of its log can be read before this
        task destroys it) rather than destroying it. Not for a job that nobody here waits for: a created
        instance's command ends its billing for good (``GpuMarketCreateInstanceOperator``)."""
        return False

    def _creation_body(
        self, *, label: str | None, base_url: str | None, bid: float | None = None, preemptions: int = 0
    ) -> dict[str, Any]:
        fields = self._creation_fields(base_url)
        if bid is not None:
            fields["price"] = bid
        if self.interruptible:  # on demand too, after a fallback: the job still learns which run it is
            fields["env"] = job_env(fields.get("env"), preemptions=preemptions)
        return api.build_create_instance_body(label=label, **fields)
