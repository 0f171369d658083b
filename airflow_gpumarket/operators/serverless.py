"""Operators for serverless endpoints and deployments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import is_templated


class GpuMarketCreateEndpointOperator(GpuMarketBaseOperator):
    """Create a serverless endpoint; returns the new endpoint's id (the response's ``result``).

    Every argument is one of the spec's 13 endpoint fields, templated, and only those given are sent. The
    endpoint_state enum and ``target_queue_time <= max_queue_time`` are checked when the DAG is parsed.
    Creating is not idempotent: the call is not re-sent after a failure that may have been processed.

    :param endpoint_name: name of the endpoint.
    :param endpoint_state: active, suspended or stopped.
    :param min_load: minimum load for the endpoint.
    :param min_cold_load: cold workers are kept below this load.
    :param target_util: target utilisation.
    :param cold_mult: multiplier for cold start.
    :param cold_workers: number of cold workers.
    :param max_workers: maximum number of workers.
    :param max_queue_time: seconds of queueing before scaling up.
    :param target_queue_time: desired queue time, <= max_queue_time.
    :param autoscaler_instance: autoscaler environment to attach to.
    :param inactivity_timeout: idle seconds before it may be suspended.
    :param overrecruit_ratio: over-recruiting of workers for spikes.
    """

    template_fields: Sequence[str] = api.ENDPOINT_FIELDS

    def __init__(
        self,
        *,
        endpoint_name: str | None = None,
        endpoint_state: str | None = None,
        min_load: float | None = None,
        min_cold_load: float | None = None,
        target_util: float | None = None,
        cold_mult: float | None = None,
        cold_workers: int | None = None,
        max_workers: int | None = None,
        max_queue_time: float | None = None,
        target_queue_time: float | None = None,
        autoscaler_instance: str | None = None,
        inactivity_timeout: float | None = None,
        overrecruit_ratio: float | None = None,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        given = locals()  # each endpoint field is a keyword above (autocompletion, default_args); kept as given
        for name in api.ENDPOINT_FIELDS:
            setattr(self, name, given[name])
        fields = self._fields()
        if not any(is_templated(v) for v in fields.values()):
            api.build_endpoint_body(**fields)

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in api.ENDPOINT_FIELDS}

    def execute(self, context: Any) -> int:
        fields = self._fields()
        api.build_endpoint_body(**fields)  # after rendering, before sending
        result = self.hook.create_endpoint(**fields)
        endpoint_id = result.get("result")
        self.log.info("Created endpoint %r: id %s", self.endpoint_name, endpoint_id)
        return endpoint_id  # type: ignore[return-value]


class GpuMarketDeleteDeploymentOperator(GpuMarketBaseOperator):
    """Soft-delete every deployment called ``name`` (and ``tag``), cascading to its endpoints and workers.

    Returns the number of deployments affected. A count of 0 succeeds by default, so the operator is safe as a
    teardown task and when re-run; set ``fail_if_none=True`` to make "nothing matched" a failure (a typo in the
    name then shows up as a failed task instead of a silent no-op).

    :param name: deployment name.
    :param tag: optional tag; without it, every deployment with that name is deleted.
    :param fail_if_none: fail when no deployment matched (default False).
    """

    template_fields: Sequence[str] = ("name", "tag")
    ui_color = "#ffd6d6"

    def __init__(
        self,
        *,
        name: str,
        tag: str | None = None,
        fail_if_none: bool = False,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.name = name
        self.tag = tag
        self.fail_if_none = fail_if_none
        if not is_templated(name) and not is_templated(tag):
            api.build_delete_deployments_body(name, tag)

    def execute(self, context: Any) -> int:
        result = self.hook.delete_deployments(self.name, self.tag)
        count = int(result.get("count") or 0)
        target = f"name {self.name!r}" + (f" and tag {self.tag!r}" if self.tag else "")
        if count == 0:
            message = f"No deployment matched {target}: nothing was deleted"
            if self.fail_if_none:
                raise AirflowException(f"{message} (fail_if_none=True). Check the name and tag.")
            self.log.warning("%s", message)
        else:
            self.log.info("Deleted %d deployment(s) matching %s, with their endpoints and workers", count, target)
        return count
