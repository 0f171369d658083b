"""The renting operators: rent an instance and hand it to the DAG (``GpuMarketCreateInstanceOperator``), or run a
job on one from rent to destroy (``GpuMarketRunJobOperator``). Both go through ``renting``'s one mechanism.
Searching, stopping, destroying and reaping are in ``search``, ``teardown`` and ``reaper``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.failures import GpuMarketJobFailed
from airflow_gpumarket.operators.guard import destroy_rentals_on_failure
from airflow_gpumarket.operators.renting import JOB_LEASE_MARGIN_SECONDS, KEEPALIVE_POLLS, GpuMarketRentingBaseOperator
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import lifecycle
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle = RunTimeModule("airflow_gpumarket.lifecycle")

#: Also importable from here, as the README shows: the failure callback for mapped tasks, and the base.
__all__ = [
    "GpuMarketCreateInstanceOperator",
    "GpuMarketRentingBaseOperator",
    "GpuMarketRunJobOperator",
    "destroy_rentals_on_failure",
]


class GpuMarketCreateInstanceOperator(GpuMarketRentingBaseOperator):
    """Rent an instance and (by default) wait until it is running; returns the instance, never its key.

    Made to be a setup task: pair it with ``GpuMarketDestroyInstanceOperator(...).as_teardown(setups=...)``.
    If anything fails before the instance is running, it destroys what it made and tries the next offer.

    :param wait_for_running: wait until running (default True); False returns right after creation.
    :param lease: how long the instance may live before ``GpuMarketReapOrphansOperator`` destroys it should the
        teardown never run (default 6 hours); written into the label.
    (Other parameters: see ``GpuMarketRentingBaseOperator``.)
    """

    def __init__(
        self, *, wait_for_running: bool = True, lease: timedelta | float = timedelta(hours=6), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.wait_for_running = wait_for_running
        self.lease = duration_seconds("lease", lease)

    _hands_over_its_instance = True

    def _should_wait(self) -> bool:
        return self.wait_for_running

    def _lease_seconds(self) -> float:
        return self.lease  # type: ignore[return-value]

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
        self._instance_id = None  # handed over to the DAG (and its teardown): no longer this task's to destroy
        return summary


class GpuMarketRunJobOperator(GpuMarketRentingBaseOperator):
    """The whole lifecycle in one task: rent, run ``command`` through onstart, wait for it, destroy.

    The command is wrapped (``airflow_gpumarket.job_script``) so the instance ends its own compute billing when
    the command exits: it prints its exit status and stops the instance. The task then reads the end of the job's
    log (every line since the last read reaches the task log, up to ``api.LOG_TAIL_DEFAULT`` lines), destroys the
    instance, and succeeds when the status read is 0. With ``log_interval=0`` nothing is read: the wrapper destroys
    the instance after exit 0 (gone = success) and stops it otherwise. The instance is destroyed in every case
    before the task ends.

    :param command: shell commands to run on the instance (templated; required).
    :param max_runtime: the job's own time limit, counted from when the instance is first seen running, which is
        when the job starts (default 6 hours); never later than boot_timeout + max_runtime after creation.
    :param keepalive: while the task watches the job (in the worker or the triggerer), the lease in the instance's
        label is kept this far ahead and renewed every third of it, one label change each time (default 15
        minutes). When nothing has watched for that long (worker and triggerer both gone),
        ``GpuMarketReapOrphansOperator`` may destroy the instance; the waiting side then reports the job's outcome
        as unknown rather than as success. ``None``: one lease for the whole job (boot_timeout + max_runtime +
        15 minutes), never renewed.
    (Other parameters: see ``GpuMarketRentingBaseOperator``; runtype defaults to ``ssh_proxy``.)
    """

    _waits_for_job = True

    def __init__(
        self,
        *,
        command: str,
        max_runtime: timedelta | float = timedelta(hours=6),
        keepalive: timedelta | float | None = timedelta(minutes=15),
        **kwargs: Any,
    ) -> None:
        if "onstart" in kwargs:
            raise GpuMarketValidationError("onstart", "is built from command by GpuMarketRunJobOperator; pass command")
        if command is None:
            raise GpuMarketValidationError("command", "is required: the shell commands the job runs")
        super().__init__(command=command, **kwargs)
        self.max_runtime = duration_seconds("max_runtime", max_runtime)
        self.keepalive = None if keepalive is None else duration_seconds("keepalive", keepalive)
        if self.keepalive is not None and self.keepalive < KEEPALIVE_POLLS * self.poll_interval:
            raise GpuMarketValidationError(
                "keepalive",
                f"is {self.keepalive:g} s, shorter than {KEEPALIVE_POLLS} poll intervals "
                f"({KEEPALIVE_POLLS * self.poll_interval:g} s): the lease could run out between two reads; "
                "make it longer, or None for one lease covering the whole job",
            )

    def _lease_seconds(self) -> float:
        return self.boot_timeout + self.max_runtime + JOB_LEASE_MARGIN_SECONDS

    def _keepalive_seconds(self) -> float | None:
        return self.keepalive

    def _limits(self, rental: lifecycle.Rental) -> tuple[float | None, float | None]:
        return rental.created_at + self.boot_timeout + self.max_runtime, self.max_runtime

    def _stops_on_success(self) -> bool:
        """The wrapper stops the instance after exit 0 and the final read of its log shows every line and the exit
        status before the destroy. With ``log_interval=0`` nothing reads the log, so the wrapper destroys the
        instance after exit 0 and "gone" means success (its output goes with it)."""
        return self.log_interval > 0

    def _complete(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any] | None) -> Any:
        assert event is not None  # a job is always waited for
        succeeded = lifecycle.event_kind(event) is lifecycle.EventKind.JOB_SUCCEEDED
        if succeeded and lifecycle.destroyed_itself(event) and self._stops_on_success():
            self._forget(rental.instance_id)  # the wrapper stops after exit 0 here: somebody else destroyed it
            raise AirflowException(
                f"instance {rental.instance_id} was destroyed before the end of its job could be read (by hand, or "
                "by the reaper after its lease ran out): the job's outcome and its last output are unknown"
            )
        if succeeded and lifecycle.destroyed_itself(event):
            self._forget(rental.instance_id)  # a 404 proved it: the instance destroyed itself, billing has ended
        else:
            self._destroy(rental.instance_id)
        summary = self._summary(rental, event.get("actual_status"))
        summary["job_status"] = "succeeded" if succeeded else "failed"
        self.log.info(
            "Job on instance %s %s after %s; compute cost about $%s (at $%s/h)",
            rental.instance_id,
            summary["job_status"],
            lifecycle.format_duration(summary["elapsed_seconds"]),
            summary["estimated_cost"],
            rental.hourly_price,
        )
        if not succeeded:
            sentence = lifecycle.describe_event(event, rental.instance_id)
            if lifecycle.event_kind(event) is lifecycle.EventKind.JOB_FAILED:
                raise GpuMarketJobFailed(sentence, exit_status=event.get("exit_status"))
            raise AirflowException(sentence)
        return summary
