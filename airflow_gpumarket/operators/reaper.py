"""The last line of defence: destroy what this provider rented once its lease (written in its label) ran out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_gpumarket import api, lifecycle
from airflow_gpumarket.operators.base import GpuMarketBaseOperator


class GpuMarketReapOrphansOperator(GpuMarketBaseOperator):
    """Destroy instances this provider rented whose lease (in their label) has expired.

    For a maintenance DAG run every few minutes (one list walk per run): the last line of defence when a worker
    vanished and neither a teardown nor the failure callback ran.
    Instances without this provider's label are never touched.

    :param report_only: only report what would be destroyed.
    :param grace: extra time past the lease before destroying (default 0).
    """

    template_fields: Sequence[str] = ("report_only",)

    def __init__(
        self,
        *,
        report_only: bool = False,
        grace: timedelta | float = 0,
        gpumarket_conn_id: str = "gpumarket_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpumarket_conn_id = gpumarket_conn_id
        self.report_only = report_only
        self.grace: float = grace.total_seconds() if isinstance(grace, timedelta) else grace
        api.require_non_negative_number("grace", self.grace)

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_gpumarket.operators.budget import settle_ended
        from airflow_gpumarket.ui import records

        now = time.time()
        expired = []
        for instance in self.hook.list_instances():
            parsed = lifecycle.parse_label(instance.get("label"))
            if parsed and parsed[1] + self.grace < now:
                expired.append(instance)
        destroyed, per_hour = [], 0.0
        for instance in expired:
            instance_id = int(instance["id"])
            overdue = lifecycle.format_duration(now - lifecycle.parse_label(instance["label"])[1])  # type: ignore[index]
            if not self.report_only:
                self.hook.destroy_instance(instance_id)
                records.push_end(context, self.log, self.hook, instance_id, ended_by=self.task_id, instance=instance)
                settle_ended(
                    self.hook, self.gpumarket_conn_id, instance_id, self.log, started=instance.get("start_date")
                )
            destroyed.append(instance_id)
            per_hour += float(instance.get("dph_total") or 0)  # type: ignore[arg-type]
            self.log.warning(
                "%s instance %s (label %s, lease expired %s ago, status %r, $%s/h)",
                "Would destroy" if self.report_only else "Destroyed",
                instance_id,
                instance.get("label"),
                overdue,
                instance.get("actual_status"),
                instance.get("dph_total", "?"),
            )
        self.log.info(
            "Reaped %d orphan(s); that stops about $%.4f per hour of compute billing", len(destroyed), per_hour
        )
        return {"destroyed": destroyed, "report_only": self.report_only, "dollars_per_hour_saved": round(per_hour, 4)}
