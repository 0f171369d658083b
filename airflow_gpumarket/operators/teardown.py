"""Ending an instance's billing: stop (compute only) and destroy (everything).

The destroy is idempotent, so it is the teardown of a rental made by ``GpuMarketCreateInstanceOperator``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.base import GpuMarketBaseOperator
from airflow_gpumarket.utils import check_instance_id_argument, instance_id_from


class _OneInstanceOperator(GpuMarketBaseOperator):
    """An operator that acts on one instance, given by id or by ``GpuMarketCreateInstanceOperator``'s result."""

    template_fields: Sequence[str] = ("instance_id",)

    def __init__(self, *, instance_id: Any, gpumarket_conn_id: str = "gpumarket_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.instance_id = instance_id
        check_instance_id_argument(instance_id)


class GpuMarketStopInstanceOperator(_OneInstanceOperator):
    """Stop an instance: compute billing halts, disk charges continue (destroy to stop those too).

    :param instance_id: id, or the dict returned by ``GpuMarketCreateInstanceOperator`` (templated).
    """

    def execute(self, context: Any) -> dict[str, Any]:
        instance_id = instance_id_from(self.instance_id)
        if instance_id is None:
            raise GpuMarketValidationError("instance_id", "is empty: there is no instance to stop")
        result = self.hook.stop_instance(instance_id)
        self.log.info("Stopped instance %s (disk charges continue until it is destroyed)", instance_id)
        return result


class GpuMarketDestroyInstanceOperator(_OneInstanceOperator):
    """Destroy an instance; idempotent (already gone is success), so it is made to be a teardown task.

    :param instance_id: id, or the dict returned by ``GpuMarketCreateInstanceOperator`` (templated). When it is
        empty (the setup task failed before returning, having destroyed what it made), there is nothing to do.
    """

    ui_color = "#ffd6d6"

    def execute(self, context: Any) -> dict[str, Any]:
        instance_id = instance_id_from(self.instance_id)
        if instance_id is None:
            self.log.info("No instance id: nothing to destroy")
            return {"success": True, "destroyed": None}
        from airflow_gpumarket.operators.budget import settle_ended
        from airflow_gpumarket.ui import records

        instance = self._read(instance_id)
        result = self.hook.destroy_instance(instance_id)
        self.log.info("Destroyed instance %s%s", instance_id, " (already gone)" if result.get("already_gone") else "")
        if not result.get("already_gone"):
            records.push_end(context, self.log, self.hook, instance_id, ended_by=self.task_id, instance=instance)
        # Gone already (its job's wrapper destroyed it, say): its reservation must not stay at its worst case.
        start = (instance or {}).get("start_date")
        settle_ended(self.hook, self.gpumarket_conn_id, instance_id, self.log, started=start)
        return {"success": True, "destroyed": instance_id, "already_gone": bool(result.get("already_gone"))}

    def _read(self, instance_id: int) -> Mapping[str, Any] | None:
        """The instance before its destroy (its start, price and label go into the end record), if it can be read."""
        try:
            return self.hook.get_instance(instance_id)
        except GpuMarketError as exc:
            self.log.info("Could not read instance %s before destroying it: %s", instance_id, exc)
            return None
