"""Destroy on every failure path: what a renting task rented is destroyed when its try fails in any way (an
exception, SIGTERM or ``execution_timeout`` through ``on_kill``, a worker lost without a trace through the failure
callback that Airflow runs elsewhere), and a retry adopts what an earlier try left rather than renting again."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import api
from airflow_gpumarket._compat import AirflowException, TaskDeferred
from airflow_gpumarket.exceptions import GpuMarketError
from airflow_gpumarket.utils import RunTimeModule

if TYPE_CHECKING:
    from airflow_gpumarket import job_logs, lifecycle
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook
    from airflow_gpumarket.ui.records import RentalRecorder
else:  # what only a running task needs: not imported when a DAG file is parsed
    job_logs, lifecycle = RunTimeModule("airflow_gpumarket.job_logs"), RunTimeModule("airflow_gpumarket.lifecycle")


def destroy_rentals_on_failure(context: Any) -> None:
    """Failure callback that every renting operator adds to its ``on_failure_callback`` list.

    Airflow runs failure callbacks in the worker after a failed try, and in the DAG processor when the scheduler
    fails a task whose worker stopped heartbeating (the worker was lost and no provider code could run). Either
    way, this destroys every instance carrying the task instance's label key. For mapped tasks (``partial()`` does
    not run the operator's ``__init__`` where the DAG processor looks), pass it yourself:
    ``.partial(..., on_failure_callback=destroy_rentals_on_failure)`` (``@task.gpumarket`` does it itself). There
    the task is the mapped task itself, never unmapped: its connection comes from the ``partial()`` arguments and
    the label key from the failed task instance's map index.
    """
    task: Any = context.get("task") if isinstance(context, Mapping) else None
    if isinstance(task, RentalGuard):
        task._destroy_rentals_of_this_task(context, "the task failed")
        return
    operator_class = getattr(task, "operator_class", None)  # a mapped task (MappedOperator)
    if not (isinstance(operator_class, type) and issubclass(operator_class, RentalGuard)):
        return
    from airflow_gpumarket.hooks.gpumarket import GpuMarketHook

    partial_kwargs = getattr(task, "partial_kwargs", None) or {}
    hook = GpuMarketHook(partial_kwargs.get("gpumarket_conn_id", GpuMarketHook.default_conn_name))
    ti = context.get("ti")
    key = lifecycle.rental_key(
        task.dag_id or "", str(context.get("run_id")), task.task_id, getattr(ti, "map_index", -1)
    )
    log = getattr(task, "log", None) or hook.log
    for instance in lifecycle.rentals_of(hook.list_instances(), key):
        log.warning("The task failed: destroying instance %s so it stops billing", instance["id"])
        hook.destroy_instance(int(instance["id"]))


#: The task state store's key (Airflow 3.3+) of the rental a task instance holds: a retry reconnects to it.
STATE_KEY = "gpumarket_rental"


class RentalGuard:
    """The renting operator's part that destroys what it rented on every failure path, and adopts on a retry what
    an earlier try of the same task instance left, instead of renting twice. Mixed into
    ``GpuMarketRentingBaseOperator``, whose hook, log, rental key and lease it uses."""

    # A try's own state, set while it runs (class defaults: nothing to set for each task of a parsed DAG).
    _instance_id: int | None = None
    _creating_label: str | None = None
    _killed = False
    _started_at: float | None = None
    _recorder: RentalRecorder | None = None
    _store: Any = None  # the task state store (Airflow 3.3+, durable=True), else None
    durable = True

    if TYPE_CHECKING:
        hook: GpuMarketHook
        log: Any
        _waits_for_job: bool

        def _rental_key(self, context: Any) -> str: ...

        def _lease_seconds(self) -> float: ...

    def _destroy_rentals_of_this_task(self, context: Any, reason: BaseException | str) -> None:
        # No end record from here: the DAG processor runs this callback for a lost worker, and a message its
        # supervisor cannot decode (an XCom write) stalls the parsing of the DAG file until it times out.
        for instance in lifecycle.rentals_of(self.hook.list_instances(), self._rental_key(context)):
            self.log.warning("%s: destroying instance %s so it stops billing", reason, instance["id"])
            self._destroy(int(instance["id"]))

    # --- destroy on every failure path -----------------------------------------------------------------
    @contextmanager
    def _destroy_on_failure(self) -> Iterator[None]:
        """Destroy what this task rented when anything fails; deferring is not a failure."""
        try:
            yield
        except TaskDeferred:
            raise
        except BaseException as exc:
            self._cleanup_after_failure(exc)
            raise

    def _cleanup_after_failure(self, exc: BaseException) -> None:
        instance_id = self._instance_id or self._find_in_flight()
        if instance_id is not None:
            self.log.warning("Task failed (%s): destroying instance %s so it stops billing", exc, instance_id)
            self._destroy(instance_id)

    def _find_in_flight(self) -> int | None:
        """A create whose answer never came may still have made an instance: look for its label."""
        if self._creating_label is None:
            return None
        try:
            found = api.find_by_label(self.hook.list_instances(label=self._creating_label), self._creating_label)
        except GpuMarketError as exc:
            self.log.error("Could not check for an instance labelled %s: %s", self._creating_label, exc)
            return None
        return int(found["id"]) if found else None

    def _destroy(self, instance_id: int) -> None:
        """Destroy with the hook's retries; if it still fails, fail loudly with the id (it is still billing)."""
        try:
            result = self.hook.destroy_instance(instance_id)
        except GpuMarketError as exc:
            raise AirflowException(
                f"DESTROY FAILED for instance {instance_id}: it may still be billing. Destroy it by hand "
                f"(DELETE /api/v0/instances/{instance_id}/) or let the reaper DAG do it. Cause: {exc}"
            ) from exc
        self.log.info(
            "Destroyed instance %s%s", instance_id, " (it was already gone)" if result.get("already_gone") else ""
        )
        self._forget(instance_id)

    def _forget(self, instance_id: int) -> None:
        """The instance is gone (destroyed by this task, or by its own job): no longer this task's to destroy, its
        rental record ends, and the task state store forgets it."""
        if self._recorder is not None:
            self._recorder.end(instance_id)
        if self._instance_id == instance_id:
            self._instance_id = None
        saved = self._saved_instance_id()
        if saved == instance_id:
            self._store_call("delete", STATE_KEY)

    # --- the task state store (Airflow 3.3+) ------------------------------------------------------------
    def _state_store(self, context: Any) -> Any:
        """The task instance's state store when this task is durable and Airflow has one (3.3+), else None."""
        if not self.durable or not isinstance(context, Mapping):
            return None
        return context.get("task_state_store")

    def _save_rental(self, rental: lifecycle.Rental) -> None:
        """The rental goes into the task state store before anything is awaited: a retry reconnects to it."""
        saved = {"instance_id": rental.instance_id, "label": rental.label, "offer_id": rental.offer_id}
        if self._store_call("set", STATE_KEY, saved) is not False:
            self.log.info("Instance %s saved in the task state store (key %r)", rental.instance_id, STATE_KEY)

    def _saved_instance_id(self) -> int | None:
        saved = self._store_call("get", STATE_KEY)
        found = saved.get("instance_id") if isinstance(saved, Mapping) else None
        return found if isinstance(found, int) else None

    def _store_call(self, method: str, *args: Any) -> Any:
        """One call to the task state store; a store that fails is reported and the label path goes on alone."""
        if self._store is None:
            return False
        try:
            return getattr(self._store, method)(*args)
        except Exception as exc:  # noqa: BLE001 - durability is a help; the label still finds the rental
            self.log.warning(
                "The task state store failed (%s %s: %s); a retry finds the rental by its label", method, STATE_KEY, exc
            )
            return False

    def on_kill(self) -> None:
        """SIGTERM or execution_timeout: destroy now (the process may be killed for good any moment)."""
        self._killed = True
        instance_id = self._instance_id or self._find_in_flight()
        if instance_id is None:
            return
        try:
            self._destroy(instance_id)
            self.log.warning("Task killed: destroyed instance %s", instance_id)
        except Exception as exc:  # on_kill must not raise; the message names the instance
            self.log.error("Task killed: %s", exc)

    # --- retries of a task whose worker died -------------------------------------------------------------
    def _adopt_earlier_rental(self, context: Any) -> lifecycle.Rental | None:
        """On a retry, find what earlier tries of this task instance rented: keep one that may still work,
        destroy the rest. The first try skips this (nothing can exist yet), saving an API call."""
        ti = context.get("ti") if isinstance(context, Mapping) else None
        if ti is None or (getattr(ti, "try_number", 1) or 1) <= 1:
            return None
        earlier = lifecycle.rentals_of(self.hook.list_instances(), self._rental_key(context))
        saved = self._saved_instance_id()
        if saved is not None:  # reconnect to the one an earlier try saved first; the label finds any other
            self.log.info("Retry: the task state store names instance %s, rented by an earlier try", saved)
            earlier = sorted(earlier, key=lambda instance: instance.get("id") == saved)
        adopted = None
        for instance in reversed(earlier):
            if adopted is None and self._may_adopt(instance):
                adopted = instance
            else:
                self.log.warning("Destroying instance %s left by an earlier try", instance.get("id"))
                self._destroy(int(instance["id"]))
        if adopted is None:
            return None
        self._instance_id = int(adopted["id"])
        self.log.warning(
            "Retry: adopting instance %s (status %r) rented by an earlier try instead of renting again",
            adopted["id"],
            adopted.get("actual_status"),
        )
        created_at = lifecycle.started_at(adopted, fallback=time.time(), now=time.time())
        offer_id = adopted.get("offer_id")
        return lifecycle.Rental(
            instance_id=self._instance_id,
            offer_id=offer_id,
            dph_total=adopted.get("dph_total"),
            gpu_name=adopted.get("gpu_name"),
            label=adopted.get("label"),
            created_at=created_at,
            lease_cap=created_at + self._lease_seconds(),
            bid=adopted.get("bid_price") if adopted.get("is_bid") else None,
            machine_id=adopted.get("machine_id"),
            attempts=lifecycle.Attempts(tried=[] if offer_id is None else [int(offer_id)]),
            recorded_at=start if api.is_positive_number(start := adopted.get("start_date")) else None,
        )

    def _may_adopt(self, instance: Mapping[str, Any]) -> bool:
        """Keep an instance that may still work: booting or running, or (waiting for a job) stopped by the job
        wrapper after the job succeeded, whose success the wait then reads from the log instead of running the job
        again. A job that failed is run again, which is what a retry is for."""
        status = instance.get("actual_status")
        if api.is_booting(status) or status == api.STATUS_RUNNING:
            return True
        return status == api.STATUS_STOPPED and self._waits_for_job and self._job_succeeded(instance)

    def _job_succeeded(self, instance: Mapping[str, Any]) -> bool:
        """Whether the log of a stopped instance ends with the job wrapper's exit status 0. A log that cannot be
        read proves nothing: the instance is destroyed and the job runs again, as it would without this read."""
        try:
            text = self.hook.get_instance_logs(int(instance["id"]))
        except GpuMarketError as exc:
            self.log.warning("Cannot read the log of instance %s to see how its job ended (%s)", instance["id"], exc)
            return False
        return job_logs.exit_status(job_logs.split_lines(text, complete_only=False)) == 0
