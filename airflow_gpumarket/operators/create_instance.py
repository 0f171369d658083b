"""``GpuMarketCreateInstanceOperator``: rent an instance and hand it to the DAG, a setup task."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.operators.renting import GpuMarketRentingBaseOperator
from airflow_gpumarket.operators.spec import Terms
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import metrics, outcome
    from airflow_gpumarket.operators import failures
    from airflow_gpumarket.operators.result import RentalResult
else:  # what only a running task needs: not imported when a DAG file is parsed
    metrics, outcome = RunTimeModule("airflow_gpumarket.metrics"), RunTimeModule("airflow_gpumarket.outcome")
    failures = RunTimeModule("airflow_gpumarket.operators.failures")


class GpuMarketCreateInstanceOperator(GpuMarketRentingBaseOperator):
    """Rent an instance and (by default) wait until it is running; returns the instance, never its key.

    Made to be a setup task: pair it with ``GpuMarketDestroyInstanceOperator(...).as_teardown(setups=...)``.
    If anything fails before the instance is running, it destroys what it made and tries the next offer.

    :param wait_for_running: wait until running (default True); False returns right after creation.
    :param lease: how long the instance may live before ``GpuMarketReapOrphansOperator`` destroys it should the
        teardown never run (default 6 hours); written into the label.

    Other parameters: see ``GpuMarketRentingBaseOperator``.
    """

    def __init__(
        self, *, wait_for_running: bool = True, lease: timedelta | float = timedelta(hours=6), **kwargs: Any
    ) -> None:
        lease = duration_seconds("lease", lease)
        kwargs.setdefault("terms", Terms(waits=wait_for_running, hands_over=True, lease=lease))
        super().__init__(**kwargs)
        self.wait_for_running = wait_for_running
        self.lease = lease

    def _complete(self, result: RentalResult) -> Any:
        from airflow_gpumarket.operators.result import summary
        from airflow_gpumarket.operators.session import Outcome

        rental, ended = result.rental, result.outcome
        if ended is not None and ended.kind is not outcome.EventKind.REACHED:
            raise failures.GpuMarketOutcomeUnknown(ended.describe(rental.instance_id))
        if ended is not None:
            self.log.info("%s", ended.describe(rental.instance_id))
        done = summary(rental, result.status, self.hook.service_now)
        if done["actual_status"] == api.STATUS_RUNNING:
            try:
                instance = self.hook.get_instance(rental.instance_id)
                done["ssh_host"], done["ssh_port"] = instance.get("ssh_host"), instance.get("ssh_port")
            except GpuMarketError as exc:
                self.log.warning("Could not read the SSH address of instance %s: %s", rental.instance_id, exc)
        assert self.session is not None  # made by execute and execute_complete
        self.session.end(rental, Outcome.HANDED_OVER, metric=metrics.HANDED_OVER, why="handed over to the DAG")
        return done
