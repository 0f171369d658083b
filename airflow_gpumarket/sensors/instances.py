"""Sensor that waits for an instance status, or for the job run through onstart to finish."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowFailException, BaseSensorOperator
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.utils import (
    DEFAULT_DEFERRABLE,
    RunTimeModule,
    check_instance_id_argument,
    duration_seconds,
    instance_id_from,
)

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle, outcome, waiting
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
else:  # what only a running sensor needs: not imported when a DAG file is parsed
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")
    waiting, outcome = RunTimeModule("airflow_gpumarket.waiting"), RunTimeModule("airflow_gpumarket.outcome")


class GpuMarketInstanceStatusSensor(BaseSensorOperator):
    """Wait until an instance reaches ``target_status`` (default running), or until its job ends.

    Fails fast, naming the status, when the instance ends in exited, unknown or offline (those never become
    running) or disappears. With ``wait_for_job=True`` it waits through boot and the job started by the
    provider's onstart wrapper (see ``GpuMarketRunJobOperator``): the instance gone means the job exited 0
    (success), stopped means it failed (the task fails).

    :param instance_id: id, or the dict returned by ``GpuMarketCreateInstanceOperator`` (templated).
    :param target_status: status to wait for (default running).
    :param wait_for_job: wait for the onstart job's outcome instead of a status.
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param poke_interval: seconds between reads (default 10, as the spec recommends).
    :param log_interval: with ``wait_for_job``, seconds between reads of the job's output (new lines go to the
        task log, each once; a failed job's exit status and last lines go into the exception), as
        ``GpuMarketRunJobOperator`` does; default 30 s, 0 reads nothing. In ``reschedule`` mode each poke starts
        afresh, so lines may repeat there.
    """

    template_fields: Sequence[str] = ("instance_id", "target_status")

    def __init__(
        self,
        *,
        instance_id: Any,
        target_status: str = api.STATUS_RUNNING,
        wait_for_job: bool = False,
        gpumarket_conn_id: str = "gpumarket_default",
        deferrable: bool | None = None,
        poke_interval: timedelta | float = api.POLL_INTERVAL_SECONDS,
        log_interval: timedelta | float = api.LOG_INTERVAL_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.instance_id = instance_id
        self.target_status = target_status
        self.wait_for_job = wait_for_job
        self.gpumarket_conn_id = gpumarket_conn_id
        self.deferrable = DEFAULT_DEFERRABLE if deferrable is None else deferrable
        self.log_interval = duration_seconds("log_interval", log_interval, zero_ok=True) if wait_for_job else 0.0
        self._wait: waiting.Wait | None = None
        api.require_positive_number("poke_interval", self.poke_interval)
        check_instance_id_argument(instance_id)
        if not isinstance(target_status, str) or not target_status:
            raise GpuMarketValidationError(
                "target_status", f"must be a status name such as 'running', got {target_status!r}"
            )

    @cached_property
    def hook(self) -> GpuMarketHook:
        from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

        return GpuMarketHook(self.gpumarket_conn_id)

    @property
    def _wait_for(self) -> str:
        return lifecycle.WAIT_JOB if self.wait_for_job else lifecycle.WAIT_STATUS

    def _watch(self, deadline: float | None = None) -> waiting.Watch:
        return waiting.Watch(wait_for=self._wait_for, target_status=self.target_status, deadline=deadline)

    def _instance(self) -> int:
        instance_id = instance_id_from(self.instance_id)
        if instance_id is None:
            raise GpuMarketValidationError("instance_id", "is empty: the task that should provide it returned nothing")
        return instance_id

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from airflow_gpumarket.triggers.instances import GpuMarketInstanceStatusTrigger

        self.defer(
            trigger=GpuMarketInstanceStatusTrigger(
                instance_id=self._instance(),
                gpumarket_conn_id=self.gpumarket_conn_id,
                watch=self._watch(deadline=time.time() + float(self.timeout) if self.timeout else None).to_dict(),
                poll_interval=float(self.poke_interval),  # type: ignore[arg-type]
                log_interval=self.log_interval,
            ),
            method_name="execute_complete",
        )

    def poke(self, context: Any) -> bool:
        instance_id = self._instance()
        if self._wait is None:  # made at the first poke, once the fields are rendered
            self._wait = waiting.Wait(self._watch(), job_logs.LogPump(instance_id, self.log_interval), self.log)
        seen = self.hook.run_flow(waiting.read_flow(self.hook, instance_id))
        if seen.error is not None and not api.is_retryable(seen.error):
            raise seen.error
        ended = self.hook.run_flow(self._wait.step(self.hook, seen, time.time()))
        return ended is not None and self._conclude(ended)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        try:
            ended, _ = outcome.from_event(event)
        except ValueError as exc:
            raise AirflowFailException(f"Cannot resume waiting for instance {self.instance_id}: {exc}") from None
        for line in ended.final_lines:
            self.log.info("%s", line)
        return self._conclude(ended)

    def _conclude(self, ended: outcome.WaitOutcome) -> bool:
        sentence = ended.describe()
        if ended.kind in (outcome.EventKind.REACHED, outcome.EventKind.JOB_SUCCEEDED):
            self.log.info("%s", sentence)
            return True
        raise AirflowFailException(sentence)
