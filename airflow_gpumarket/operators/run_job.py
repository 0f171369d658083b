"""``GpuMarketRunJobOperator``: rent an instance, run a job on it through onstart, wait for it, destroy it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators import cost
from airflow_gpumarket.operators.failures import (
    GpuMarketBudgetExceeded,
    GpuMarketJobFailed,
    GpuMarketStagingFailed,
)
from airflow_gpumarket.operators.renting import KEEPALIVE_POLLS, GpuMarketRentingBaseOperator
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import assets, lifecycle, metrics
else:  # what only a running task needs: not imported when a DAG file is parsed
    lifecycle = RunTimeModule("airflow_gpumarket.lifecycle")
    assets, metrics = RunTimeModule("airflow_gpumarket.assets"), RunTimeModule("airflow_gpumarket.metrics")


class GpuMarketRunJobOperator(GpuMarketRentingBaseOperator):
    """The whole lifecycle in one task: rent, run ``command`` through onstart, wait for it, destroy.

    The command runs in the provider's job wrapper (``airflow_gpumarket.job_script``), which prints its exit status
    and stops the instance when it exits. The task reads the end of the job's log, destroys the instance, and
    succeeds when the status read is 0. With ``log_interval=0`` nothing is read: the wrapper destroys the instance
    after exit 0 (gone = success) and stops it otherwise. The instance is destroyed in every case.

    :param command: shell commands to run on the instance (templated; required).
    :param max_runtime: the job's own time limit, counted from when the instance is first seen running
        (default 6 hours); never later than boot_timeout + max_runtime after creation.
    :param keepalive: while the task watches the job, the lease in the instance's label is kept this far ahead
        and renewed every third of it (default 15 minutes). When nothing has watched for that long, the reaper may
        destroy the instance. ``None``: one lease for the whole job, never renewed.

    Other parameters: see ``GpuMarketRentingBaseOperator``; runtype defaults to ``ssh_proxy``.
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
        if kwargs.get("onstart") is not None:
            raise GpuMarketValidationError("onstart", "is built from command by GpuMarketRunJobOperator; pass command")
        if command is None:
            raise GpuMarketValidationError("command", "is required: the shell commands the job runs")
        super().__init__(command=command, **kwargs)
        self.max_runtime = duration_seconds("max_runtime", max_runtime)
        self.keepalive = None if keepalive is None else duration_seconds("keepalive", keepalive)
        if self.keepalive is not None and self.keepalive < KEEPALIVE_POLLS * self.poll_interval:
            raise GpuMarketValidationError(
                "keepalive",
                f"is {self.keepalive:g} s, shorter than {KEEPALIVE_POLLS} poll intervals; the lease could run out "
                "between two reads. Make it longer, or None for one lease covering the whole job",
            )

    def _end(self, rental: lifecycle.Rental, *, succeeded: bool, started: bool = True) -> None:
        """Save the checkpoint (of a job that started), copy the outputs after exit 0, then destroy.

        Fails naming any output lost.
        """
        assert self._guard is not None
        self._drop_source(rental)
        lost: dict[str, str] = {}
        if self._stager is not None:
            if started:
                self._stager.save(rental.instance_id)
            if succeeded:
                lost = self._stager.stage_out(rental.instance_id)
        if lost and self.keep_on_output_failure:
            self._keep_for_outputs(rental)
        else:
            self._guard.destroy(rental.instance_id)
        if lost:
            raise GpuMarketStagingFailed(
                f"The job on instance {rental.instance_id} succeeded, but {len(lost)} output(s) did not reach the "
                "cloud integration: " + "; ".join(f"{path} -> {why}" for path, why in lost.items())
            )

    def _keep_for_outputs(self, rental: lifecycle.Rental) -> None:
        """Keep the stopped instance (storage bills) under a lease the reaper honours, to copy its outputs by hand."""
        assert self._guard is not None and self.keep_on_output_failure is not None
        until = time.time() + self.keep_on_output_failure
        # Under a key of its own: the task's failure callback destroys what carries the task's key.
        self.hook.label_instance(rental.instance_id, lifecycle.make_label(lifecycle.kept_key(self._guard.key), until))
        self._guard.release()
        self.log.error(
            "Keeping stopped instance %s for %s (keep_on_output_failure; storage bills, compute does not), for its "
            "outputs to be copied by hand (`vastai cloud copy`); the reaper destroys it after that",
            rental.instance_id,
            lifecycle.format_duration(self.keep_on_output_failure),
        )

    def _complete(self, context: Any, rental: lifecycle.Rental, event: dict[str, Any] | None) -> Any:
        assert event is not None and self._guard is not None  # a job is always waited for
        succeeded = lifecycle.event_kind(event) is lifecycle.EventKind.JOB_SUCCEEDED
        not_started = self._staging_gave_up(event)
        metrics.rental_ended(metrics.outcome(event))
        if succeeded and lifecycle.destroyed_itself(event):
            self._guard.forget(rental.instance_id)  # a 404 proved it: billing has ended
            if self._stops_on_success():  # the wrapper stops after exit 0 here: somebody else destroyed it
                raise AirflowException(
                    f"instance {rental.instance_id} was destroyed before the end of its job could be read (by hand, "
                    "or by the reaper after its lease ran out): the job's outcome and its last output are unknown"
                )
        else:
            self._end(rental, succeeded=succeeded, started=not not_started)
        summary = self._summary(rental, event.get("actual_status"))
        summary["job_status"] = "succeeded" if succeeded else "failed"
        self.log.info(
            "Job on instance %s %s after %s; cost %s (at $%s/h, disk included)",
            rental.instance_id,
            summary["job_status"],
            lifecycle.format_duration(summary["elapsed_seconds"]),
            cost.text(summary["cost"], summary["cost_kind"]),
            rental.hourly,
        )
        if not succeeded:
            if event.get("limit") == lifecycle.MAX_COST:
                raise GpuMarketBudgetExceeded(
                    f"The job on instance {rental.instance_id} reached max_cost=${self.max_cost:g}: "
                    f"it cost {cost.text(summary['cost'], summary['cost_kind'])} (at ${rental.hourly:g}/h, disk "
                    "included). Its log was read and the instance destroyed; raise max_cost, or make the job shorter."
                )
            sentence = lifecycle.describe_event(event, rental.instance_id)
            if event.get("exit_status") is None and (credit := self._credit_ran_out()) is not None:
                raise GpuMarketBudgetExceeded(
                    f"The account's credit ran out (${credit:.2f}): the service stopped every instance of the account, "
                    f"this job's too ({sentence}). The instance is destroyed; add credit before running it again."
                )
            if lifecycle.event_kind(event) is lifecycle.EventKind.JOB_FAILED:
                if not_started:
                    raise GpuMarketStagingFailed(
                        f"The job on instance {rental.instance_id} did not start: its staged data did not arrive (see "
                        "the wrapper's lines above; on_restore_failure, staging_timeout). The instance is destroyed."
                    )
                raise GpuMarketJobFailed(sentence, exit_status=event.get("exit_status"))
            raise AirflowException(sentence)
        assets.annotate_outlet_events(context, summary)
        return summary

    def _staging_gave_up(self, event: dict[str, Any]) -> bool:
        """Whether the job wrapper ended without starting the job: its staged data did not arrive."""
        from airflow_gpumarket.job_script import NOT_STARTED

        if self._stager is None or lifecycle.event_kind(event) is not lifecycle.EventKind.JOB_FAILED:
            return False
        return any(NOT_STARTED in line for line in event.get("log_tail") or ())
