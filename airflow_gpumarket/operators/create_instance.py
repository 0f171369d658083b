"""``GpuMarketCreateInstanceOperator``: rent an instance and hand it to the DAG, a setup task."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.renting import GpuMarketRentingBaseOperator
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle, metrics
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle, metrics = RunTimeModule("airflow_gpumarket.lifecycle"), RunTimeModule("airflow_gpumarket.metrics")


class GpuMarketCreateInstanceOperator(GpuMarketRentingBaseOperator):
    """Rent an instance and (by default) wait until it is running; returns the instance, never its key.

    Made to be a setup task: pair it with ``GpuMarketDestroyInstanceOperator(...).as_teardown(setups=...)``.
    If anything fails before the instance is running, it destroys what it made and tries the next offer.

    :param wait_for_running: wait until running (default True); False returns right after creation.
    :param lease: how long the instance may live before ``GpuMarketReapOrphansOperator`` destroys it should the
        teardown never run (default 6 hours); written into the label.

    Other parameters: see ``GpuMarketRentingBaseOperator``.
    """

    _hands_over_its_instance = True
    wait_for_running = True

    def __init__(
        self, *, wait_for_running: bool = True, lease: timedelta | float = timedelta(hours=6), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.wait_for_running = wait_for_running
        self.lease = duration_seconds("lease", lease)
        self._validate_staging(parse_time=True)  # again: whether it waits is known only now

    def _should_wait(self) -> bool:
        return self.wait_for_running

    def _complete(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any] | None) -> Any:
        if event is not None and lifecycle.event_kind(event) is not lifecycle.EventKind.REACHED:
            raise AirflowException(lifecycle.describe_event(event, rental.instance_id))
        if event is not None:
            self.log.info("%s", lifecycle.describe_event(event, rental.instance_id))
        summary = self._summary(rental, None if event is None else event.get("actual_status"))
        if summary["actual_status"] == api.STATUS_RUNNING:
            try:
                instance = self.hook.get_instance(rental.instance_id)
                summary["ssh_host"], summary["ssh_port"] = instance.get("ssh_host"), instance.get("ssh_port")
            except GpuMarketError as exc:
                self.log.warning("Could not read the SSH address of instance %s: %s", rental.instance_id, exc)
        self._drop_source(rental)
        if self._guard is not None:
            self._guard.release()  # handed over to the DAG (and its teardown): no longer this task's to destroy
        metrics.rental_ended(metrics.HANDED_OVER)
        return summary
